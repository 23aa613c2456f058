"""The claims of issue 37's FSDP overlap run read the rows that `run_fsdp_gpu.sh`'s overlap stage writes."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

from scripts import load_script

from lmscope.records.stats import ratio_interval_rounds
from lmscope.report.claims import Rows

FOLDER = "benchmarks/results/distributed/fsdp-overlap-x2"
STRATEGIES = {"single": 1, "fsdp": 2, "fsdp:separate-reduce": 2, "torch-fsdp2": 2, "coalesced:1000": 2}


def _row(batch: int, strategy: str, times: list[float], **extra: object) -> dict:
    return {"workload": "ddp", "status": "ok", "size": "xl", "context_length": 512, "precision": "bf16",
            "batch_size": batch, "strategy": strategy, "world_size": STRATEGIES[strategy], "git_sha": "abc",
            "device_name": "NVIDIA H100", "time": "2026-12-01T10:00:00+00:00", "times_ms": times,
            "step_ms": statistics.fmean(times), "step_median_ms": statistics.median(times), **extra}


def _write(root: Path, name: str, rows: list[dict]) -> None:
    path = root / FOLDER / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_overlap_claims_pool_rounds_and_say_what_bounds_each_batch(tmp_path: Path) -> None:
    claims = load_script("benchmarks/claims.py", "claims_script")
    rng = random.Random()
    timed, by_round = [], {}
    for index in range(3):  # three interleaved rounds
        for batch in (4, 8):
            for strategy in STRATEGIES:
                times = [rng.uniform(100, 300) for _ in range(4)]
                by_round.setdefault((batch, strategy), []).append(times)
                timed.append(_row(batch, strategy, times, round=index, rounds=3))
    joined = {key: sum(rounds, []) for key, rounds in by_round.items()}
    _write(tmp_path, "overlap-xl-x2.jsonl", timed)
    busy = {4: 60.0, 8: 97.0}
    profiled = [_row(batch, strategy, joined[batch, strategy][:3], profile_step_ms=250.0,
                     profile_compute_ms=200.0, profile_exposed_comm_forward_ms=1.0,
                     profile_exposed_comm_backward_ms=2.0, profile_exposed_comm_ms=3.5, profile_idle_ms=40.0,
                     profile_wrapper_host_ms=12.0 if strategy == "fsdp" else 0.0,
                     profile_comm_ms=9.0 if strategy == "fsdp" else 0.0,
                     profile_gpu_busy_pct=busy[batch] if strategy == "single" else 150.0)
                for batch in (4, 8) for strategy in ("single", "fsdp")]
    _write(tmp_path, "overlap-xl-x2-profile.jsonl", profiled)

    earlier = [dict(row, git_sha="before1") for row in profiled if row["batch_size"] == 8]
    _write(tmp_path, "before/overlap-xl-x2-profile.jsonl", earlier)

    text = claims.fsdp_overlap(Rows(tmp_path), FOLDER, "overlap-xl-x2")
    lines = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line
             for line in text.splitlines() if line.startswith("| 4") or line.startswith("| 8")}
    for batch in (4, 8):
        for variant in ("fsdp", "fsdp:separate-reduce"):  # each against the single step and FSDP2
            ours = joined[batch, variant]
            row = lines[str(batch), variant]
            # the interval resamples the rounds, so it holds their spread
            rounds = by_round[batch, variant]
            assert ratio_interval_rounds(rounds, by_round[batch, "single"]).as_text() in row
            assert ratio_interval_rounds(by_round[batch, "torch-fsdp2"], rounds).as_text() in row
            assert f"| {claims.fmt(statistics.median(ours), 4)} |" in row
    assert "host (GPU busy 60 %)" in lines["4", "single (1 GPU)"]
    assert "GPU (GPU busy 97 %)" in lines["8", "single (1 GPU)"]
    assert "3 round(s) of interleaved points" in text and "2 ranks" in text

    profile = claims.fsdp_overlap_profile(Rows(tmp_path), FOLDER, "overlap-xl-x2", ("before",))
    body = [line for line in profile.splitlines() if line.startswith("| ") and "---" not in line][1:]
    codes = [line.split("|")[1].strip() for line in body]
    assert codes == ["before1"] * 2 + ["abc"] * 4  # the earlier code first
    assert f"`{FOLDER}/before/overlap-xl-x2-profile.jsonl`, `{FOLDER}/overlap-xl-x2-profile.jsonl`" in profile
    fsdp_rows = [line for line in profile.splitlines() if "| fsdp |" in line]
    assert len(fsdp_rows) == 3 and all(line.rstrip().endswith("| - |") for line in fsdp_rows)
    table_lines = [line for line in profile.splitlines() if line.startswith("| ")]
    cells = {cell.strip() for line in table_lines for cell in line.split("|")}
    assert "150" not in cells  # a collective's spinning is never shown as the GPU's busy share
