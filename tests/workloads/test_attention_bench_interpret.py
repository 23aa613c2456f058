"""`lmscope attention` with the Triton kernels on CPU (TRITON_INTERPRET=1), and through the CLI.

Triton reads TRITON_INTERPRET when the kernels are defined, so the workload runs in a fresh
Python process that has it set. The CLI test runs its points in the runner's worker processes.
"""

from __future__ import annotations

import json
import random

import pytest
from triton_child import run_interpreted

from lmscope.cli import main
from lmscope.records.results import read_records

MEASURE = """
import json, sys
from lmscope.workloads.attention import run_point
print(json.dumps([run_point(p) for p in json.loads(sys.argv[1])]))
"""


def test_flash_triton_rows_under_the_interpreter_match_float64():
    base = dict(impl="flash-triton", head_dim=16, passes="fwd_bwd", cpu_steps=1, device="cpu",
                seed=random.randint(0, 10_000))
    points = [
        {**base, "batch": 2, "heads": 3, "seq_len": random.choice([19, 37]), "causal": True},
        {**base, "batch": 2, "heads": 1, "seq_len": random.choice([23, 41]), "causal": False,
         "dtype": "bf16"},
    ]
    done = run_interpreted(["-c", MEASURE, json.dumps(points)])
    assert done.returncode == 0, done.stderr[-2000:]
    fp32, bf16 = json.loads(done.stdout.strip().splitlines()[-1])
    assert fp32["max_error"] < 1e-5 and fp32["max_grad_error"] < 1e-4
    assert 1e-4 < bf16["max_error"] < 5e-2 and bf16["max_grad_error"] < 1e-1
    for row in (fp32, bf16):
        assert row["error_check"] == "float64 reference" and row["fwd_bwd_ms"] > 0


def test_cli_writes_rows_table_and_plot_with_unavailable_impls_as_rows(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    with pytest.raises(SystemExit) as exited:  # an error row: exit 1 (README, exit status)
        main(["attention", "--impl", "naive,sdpa-cudnn", "--batch", "1", "--heads", "2",
              "--head-dim", "16", "--seq-len", "21", "--passes", "fwd_bwd", "--cpu-steps", "1",
              "--device", "cpu", "--plot", "--compare", "impl", "--format", "md",
              "--out", str(out), "--timeout", "240"])
    assert exited.value.code == 1
    rows = {r["impl"]: r for r in read_records(out)}
    assert rows["naive"]["status"] == "ok", rows["naive"].get("error")
    assert rows["naive"]["max_error"] < 1e-5 and rows["naive"]["fwd_bwd_ms"] > 0
    assert rows["sdpa-cudnn"]["status"] == "error"
    assert rows["sdpa-cudnn"]["error"] == "Unavailable: sdpa-cudnn needs CUDA"
    table = out.with_suffix(".md").read_text()
    assert "fwd_bwd_ms impl=naive" in table and "ratio naive/sdpa-cudnn" in table
    assert "ERROR" in table
    assert (tmp_path / "results_attention.png").exists()
    assert "sdpa-cudnn: error (Unavailable: sdpa-cudnn needs CUDA)" in capsys.readouterr().out
