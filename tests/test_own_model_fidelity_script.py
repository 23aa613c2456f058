"""benchmarks/own_model/fidelity.py end to end on a CPU with a tiny GPT-2 config."""

from pathlib import Path

import pytest
from scripts import load_script

from lmscope.records.results import read_records


def test_fidelity_rows_alternate_and_end_with_the_ratio(tmp_path: Path, capsys) -> None:
    pytest.importorskip("transformers")
    module = load_script("benchmarks/own_model/fidelity.py", "own_model_fidelity")
    out = tmp_path / "fidelity.jsonl"
    assert module.main(["--out", str(out), "--device", "cpu", "--precision", "fp32", "--batch-size", "2",
                        "--context-length", "17", "--n-embd", "24", "--n-layer", "1", "--n-head", "2",
                        "--vocab-size", "61", "--rounds", "3", "--warmup", "1", "--steps", "3"]) == 0
    rows = read_records(out)
    assert [r["method"] for r in rows] == ["lmscope", "cuda_events", "cuda_events", "lmscope", "lmscope",
                                           "cuda_events", "ratio"]
    assert all(len(r["times_ms"]) == 3 for r in rows[:6]) and rows[0]["git_sha"] is not None
    ratio = rows[-1]
    assert ratio["ratio_low"] <= ratio["ratio_plain_over_lmscope"] <= ratio["ratio_high"]
    assert ratio["ratio_plain_over_lmscope"] > 0 and "plain/lmscope" in capsys.readouterr().out
