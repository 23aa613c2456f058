"""Sweep runner: isolation of failures, timeouts, resume, interruption, worker reuse."""

import json
import os
from pathlib import Path

import pytest
import torch

from lmscope.inputs.grid import expand_grid
from lmscope.records.results import append_record, read_records
from lmscope.running.runner import classify_failure, failure_record, pending_count, run_sweep

SUPPORT = Path(__file__).parent.parent / "support"
FAULTS = "lmscope_test_faults"


@pytest.fixture(autouse=True)
def importable_fault_workload(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    paths = [str(SUPPORT), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))


def point(behaviour="ok", value=0, pid_file=""):
    return {"behaviour": behaviour, "value": value, "pid_file": pid_file}


def test_expand_grid_is_the_cartesian_product_in_order():
    grid = expand_grid({"steps": 3}, {"size": ["a", "b"], "precision": ["fp32", "bf16", "fp16"]})
    assert len(grid) == 6 and grid[0] == {"steps": 3, "size": "a", "precision": "fp32"}
    assert grid[-1] == {"steps": 3, "size": "b", "precision": "fp16"}


def test_each_failure_costs_its_point_only(tmp_path):
    out = tmp_path / "results.jsonl"
    pid_file = tmp_path / "hang.pid"
    points = [point("ok", 3), point("oom"), point("raise"), point("crash"),
              point("hang", pid_file=str(pid_file)), point("ok", 5)]
    records = run_sweep(FAULTS, points, out=out, timeout_s=5)
    assert [r["status"] for r in records] == ["ok", "oom", "error", "error", "timeout", "ok"]
    assert records[0]["value_squared"] == 9 and records[-1]["value_squared"] == 25
    assert records[2]["error"] == "RuntimeError: the first line says why"
    assert "code 3" in records[3]["error"] and "simulated crash" in records[3]["error"]
    assert "within 5 s" in records[4]["error"]
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    assert read_records(out) == records
    for record in records:
        assert {"time", "host", "host_id", "torch", "git_sha", "git_sha_declared", "source", "gpu_uuid",
                "gpu_sm_clock_mhz", "cpu_affinity_count", "load_1m", "workload", "wall_s"} <= set(record)


def test_rounds_interleave_the_points_and_resume_at_the_round_reached(tmp_path):
    out = tmp_path / "results.jsonl"

    def stop_at_fourth(index, spec):
        if index == 3:
            raise KeyboardInterrupt

    points = [point("ok", 1), point("ok", 2)]
    with pytest.raises(KeyboardInterrupt):
        run_sweep(FAULTS, points, out=out, rounds=3, isolate=False, on_start=stop_at_fourth)
    first = read_records(out)
    assert [(r["value"], r["round"], r["rounds"]) for r in first] == [(1, 0, 3), (2, 0, 3), (1, 1, 3)]
    assert pending_count(FAULTS, points, out, resume=True, rounds=3) == 3
    rest = run_sweep(FAULTS, points, out=out, rounds=3, isolate=False, resume=True)
    assert [(r["value"], r["round"]) for r in rest] == [(2, 1), (1, 2), (2, 2)]
    assert pending_count(FAULTS, points, out, resume=True, rounds=1) == 0  # round 0 is the point


def test_one_round_writes_no_round_fields(tmp_path):
    (record,) = run_sweep(FAULTS, [point("ok", 3)], out=tmp_path / "r.jsonl", isolate=False)
    assert "round" not in record and "rounds" not in record
    with pytest.raises(ValueError, match="--rounds must be a whole number of at least 1"):
        run_sweep(FAULTS, [point("ok", 3)], out=tmp_path / "r.jsonl", rounds=0)


def test_one_round_at_a_time_interleaves_separate_sweeps(tmp_path):
    out = tmp_path / "results.jsonl"
    for r in range(2):  # two "commands" that cannot share a sweep, each called once per round
        run_sweep(FAULTS, [point("ok", 1)], out=out, rounds=2, only_round=r, isolate=False)
        run_sweep(FAULTS, [point("ok", 2)], out=out, rounds=2, only_round=r, isolate=False)
    assert [(r["value"], r["round"]) for r in read_records(out)] == [(1, 0), (2, 0), (1, 1), (2, 1)]
    assert pending_count(FAULTS, [point("ok", 1)], out, resume=True, rounds=2, only_round=1) == 0
    with pytest.raises(ValueError, match=r"--round must lie in 0..1 \(a round of --rounds 2\), got 2"):
        run_sweep(FAULTS, [point("ok", 3)], out=out, rounds=2, only_round=2)


def test_resume_skips_finished_points_and_retries_errors(tmp_path):
    out = tmp_path / "results.jsonl"
    run_sweep(FAULTS, [point("ok", 1), point("raise", 2), point("oom", 4)], out=out, isolate=False)
    todo = [point("ok", 1), point("ok", 2), point("oom", 4), point("ok", 7)]
    assert pending_count(FAULTS, todo, out, resume=True) == 2
    again = run_sweep(FAULTS, todo, out=out, resume=True, isolate=False)
    assert [r["value"] for r in again] == [2, 7]
    assert len(read_records(out)) == 5


def test_run_options_are_not_part_of_a_points_identity(tmp_path):
    out = tmp_path / "results.jsonl"
    run_sweep(FAULTS, [point("ok", 1)], out=out, isolate=False)
    again = [{**point("ok", 1), "pid_file": str(tmp_path / "elsewhere")}]
    assert pending_count(FAULTS, again, out, resume=True) == 0


def test_interrupted_sweep_keeps_finished_points(tmp_path):
    out = tmp_path / "results.jsonl"

    def stop_at_third(index, spec):
        if index == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(FAULTS, [point("ok", v) for v in range(4)], out=out, on_start=stop_at_third,
                  reuse_worker=True)
    assert [r["value"] for r in read_records(out)] == [0, 1]


def test_reused_worker_serves_points_until_one_fails(tmp_path):
    out = tmp_path / "results.jsonl"
    points = [point("ok", 1), point("ok", 2), point("crash"), point("ok", 3)]
    records = run_sweep(FAULTS, points, out=out, reuse_worker=True, timeout_s=60)
    pids = [r.get("worker_pid") for r in records]
    assert pids[0] == pids[1] and pids[3] not in (None, pids[0])
    assert records[2]["status"] == "error"


def test_reused_worker_is_fresh_each_round(tmp_path):
    """Rounds are the unit the intervals resample as independent: never one process for two."""
    points = [point("ok", 1), point("ok", 2), point("ok", 3)]
    records = run_sweep(FAULTS, points, out=tmp_path / "r.jsonl", reuse_worker=True, rounds=2, timeout_s=60)
    by_round = {r: {rec["worker_pid"] for rec in records if rec["round"] == r} for r in (0, 1)}
    assert len(by_round[0]) == 1 and len(by_round[1]) == 1 and by_round[0] != by_round[1]


def test_fresh_worker_per_point_by_default(tmp_path):
    records = run_sweep(FAULTS, [point("ok", 1), point("ok", 2)], out=tmp_path / "r.jsonl")
    assert records[0]["worker_pid"] != records[1]["worker_pid"]


def test_torn_last_line_is_skipped(tmp_path):
    out = tmp_path / "results.jsonl"
    append_record(out, {"a": 1})
    with out.open("a") as handle:
        handle.write('[1, 2]\n"not a record"\n{"a": 2, "b"')
    assert read_records(out) == [{"a": 1}]
    with pytest.raises(FileNotFoundError, match="no results file"):
        read_records(tmp_path / "missing.jsonl")


def test_classify_failure():
    assert classify_failure(torch.cuda.OutOfMemoryError("x")) == "oom"
    assert classify_failure(RuntimeError("CUDA error: out of memory")) == "oom"
    assert classify_failure(MemoryError()) == "oom"
    assert classify_failure(ValueError("bad")) == "error"


def test_records_are_json_lines(tmp_path):
    out = tmp_path / "r.jsonl"
    run_sweep(FAULTS, [point("ok", 2)], out=out, isolate=False)
    line = out.read_text().splitlines()[0]
    assert json.loads(line)["status"] == "ok"


def test_failure_record_keeps_the_line_that_says_what_went_wrong():
    assert failure_record("error", 'RuntimeError: Trying to create tensor with negative dimension\n"') == {
        "status": "error", "error": "RuntimeError: Trying to create tensor with negative dimension"}
    chained = "BackendCompilerFailed: backend raised:\nRuntimeError: the cause\n\nSet TORCH_LOGS=+dynamo"
    assert failure_record("error", chained)["error"] == "RuntimeError: the cause"
    assert failure_record("timeout", "")["error"] == "timeout"
