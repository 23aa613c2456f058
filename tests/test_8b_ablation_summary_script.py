"""benchmarks/distributed/summarize_8b_ablation.py: each row beside the peer of the call that ran
it (a row run again in stage c takes stage c's peer), on the committed rows and on a copy whose
plans say otherwise."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from scripts import load_script

ROWS = Path(__file__).resolve().parent.parent / "benchmarks/results/distributed/8b-ablation-x2-h200"


@pytest.fixture(scope="module")
def script():
    return load_script("benchmarks/distributed/summarize_8b_ablation.py", "summarize_8b_ablation")


def _peer_ms(folder: Path, stage: str, label: str | None = None) -> str:
    """The step of the last ok peer of `stage` that ran before `label`'s latest fsdp row."""
    rows = [json.loads(line) for line in (folder / f"llama-peer-{stage}.jsonl").read_text().splitlines()]
    ok = [r for r in rows if r["status"] == "ok"]
    if label is not None:
        ours = [json.loads(line) for line in (folder / f"ablation-{label}.jsonl").read_text().splitlines()]
        latest = [r for r in ours if r["strategy"] == "fsdp"][-1]
        ok = [r for r in ok if r["time"] <= latest["time"]]
    return f"{ok[-1]['step_median_ms']:,.0f}"


def _cells(table: str, label: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_each_row_gets_the_peer_of_its_own_call(script, tmp_path):
    table = script.table(ROWS)
    stages = {json.loads(line)["row"]: json.loads(line).get("stage", script.ROWS[json.loads(line)["row"]])
              for line in (ROWS / "plans.json").read_text().splitlines()}
    for label, stage in stages.items():
        assert _cells(table, label)[5] == _peer_ms(ROWS, stage, label), label
    assert stages["selective"] == "c" and stages["full"] == "a"
    # stage c ran in several calls: best's latest run (a call before selective's) keeps its own peer
    assert _peer_ms(ROWS, "c", "best") != _peer_ms(ROWS, "c", "selective")

    copy = tmp_path / "rows"
    shutil.copytree(ROWS, copy)
    with (copy / "plans.json").open("a") as plans:  # full run again in a later call
        plans.write(json.dumps({"row": "full", "checkpoint": "block", "stage": "b"}) + "\n")
    full = [json.loads(line) for line in (copy / "ablation-full.jsonl").read_text().splitlines()]
    peer_b = json.loads((copy / "llama-peer-b.jsonl").read_text().splitlines()[-1])
    with (copy / "ablation-full.jsonl").open("a") as rows:  # its row, after that call's peer
        later = datetime.fromisoformat(peer_b["time"]) + timedelta(minutes=1)
        rows.write(json.dumps({**full[-1], "time": later.isoformat()}) + "\n")
    assert _cells(script.table(copy), "full")[5] == _peer_ms(copy, "b", "full")


def test_a_call_whose_peer_failed_gets_no_peer(script, tmp_path):
    """The peer column says "same call": when that call's peer failed, the row shows none rather
    than an earlier call's."""
    copy = tmp_path / "rows"
    shutil.copytree(ROWS, copy)
    selective = [json.loads(line) for line in (copy / "ablation-selective.jsonl").read_text().splitlines()]
    latest = selective[-1]
    failed_at = datetime.fromisoformat(latest["time"]) - timedelta(seconds=30)
    with (copy / "llama-peer-c.jsonl").open("a") as peers:
        peers.write(json.dumps({"status": "oom", "time": failed_at.isoformat()}) + "\n")
    assert _cells(script.table(copy), "selective")[5] == "-"
    assert _cells(script.table(ROWS), "selective")[5] == _peer_ms(ROWS, "c", "selective")


def _with_a_later_best_row(tmp_path: Path, **fields) -> tuple[Path, dict]:
    """A copy of the committed rows with one more `best` row, a minute after the latest fsdp one."""
    copy = tmp_path / "rows"
    shutil.copytree(ROWS, copy)
    best = [json.loads(line) for line in (copy / "ablation-best.jsonl").read_text().splitlines()]
    latest = [r for r in best if r["strategy"] == "fsdp"][-1]
    later = datetime.fromisoformat(latest["time"]) + timedelta(minutes=1)
    with (copy / "ablation-best.jsonl").open("a") as rows:
        rows.write(json.dumps({**latest, **fields, "time": later.isoformat()}) + "\n")
    return copy, latest


def test_a_row_run_with_its_own_reduce_group_is_shown_as_such(script, tmp_path):
    copy, latest = _with_a_later_best_row(tmp_path, strategy="fsdp:separate-reduce", step_median_ms=4321.0)
    cells = _cells(script.table(copy), "best")
    assert cells[1] == f"{latest['checkpoint']} (fsdp:separate-reduce)" and cells[2] == "4,321"


def test_a_row_run_with_cudnn_attention_and_host_moments_names_both_beside_the_variant(script, tmp_path):
    copy, latest = _with_a_later_best_row(tmp_path, strategy="fsdp:separate-reduce", attention="sdpa-cudnn",
                                          optimizer_state="host", step_median_ms=4567.0)
    profile = json.loads((ROWS / "profile-best.jsonl").read_text().splitlines()[-1])
    with (copy / "profile-best.jsonl").open("a") as rows:
        rows.write(json.dumps({**profile, "attention": "sdpa-cudnn"}) + "\n")
    table = script.table(copy)
    cells = _cells(table, "best")
    qualifiers = "fsdp:separate-reduce, sdpa-cudnn, moments on the host"
    assert cells[1] == f"{latest['checkpoint']} ({qualifiers})" and cells[2] == "4,567"
    measured, predicted = cells[3].split(" / ")  # the prediction with the moments on the host
    assert float(predicted) < float(_cells(script.table(ROWS), "best")[3].split(" / ")[1])
    assert f"Profile of the best step ({profile['policy']} (sdpa-cudnn)," in table
    assert _cells(table, "full")[1] == "block"  # flash and plain fsdp: no qualifier
