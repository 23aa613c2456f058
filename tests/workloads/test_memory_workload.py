"""The memory workload on CPU: measured phase peaks against the model, artifacts, flags, the command."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from lmscope.accounting.memory import GIB
from lmscope.cli import main
from lmscope.measure.memory import build_timeline, load_snapshot
from lmscope.records.results import read_records
from lmscope.workloads.memory import Spec, point_slug, run_point

TINY = {"size": "tiny", "device": "cpu", "batch_size": 3, "context_length": 45}
EXACT_GIB = 64 / GIB
"""The model leaves out 4-byte scalars (the loss, cross-entropy's weight total)."""


def _close(record: dict, phase: str) -> None:
    measured, predicted = record[f"{phase}_gib"], record[f"predicted_{phase}_gib"]
    assert measured is not None and predicted is not None, phase
    assert abs(measured - predicted) <= EXACT_GIB, (phase, measured, predicted)


def test_checkpointing_the_fast_model_is_refused():
    with pytest.raises(ValueError, match="drop --checkpoint or --fast"):
        Spec(size="tiny", device="cpu", attention="flash", fast=True, checkpoint="block")


def test_forward_backward_point_matches_the_model_and_writes_artifacts(tmp_path):
    record = run_point({**TINY, "mode": "forward-backward", "artifacts_dir": str(tmp_path)})
    for phase in ("after_init", "forward_peak", "backward_peak", "step_peak"):
        _close(record, phase)
    assert record["optimizer_peak_gib"] is None and record["predicted_optimizer_peak_gib"] is None
    assert abs(record["step_peak_error_pct"]) < 1e-3
    assert record["step_reserved_gib"] is None  # no caching allocator on CPU
    assert record["backward_peak_gib"] > record["forward_peak_gib"] > record["after_init_gib"]
    assert len(record["times_ms"]) == 2 and record["median_ms"] > 0
    snapshot = Path(record["snapshot_path"])
    assert snapshot.parent == tmp_path / point_slug(Spec(**{**TINY, "mode": "forward-backward",
                                                            "artifacts_dir": str(tmp_path)}))
    assert set(pickle.loads(snapshot.read_bytes())) == {"segments", "device_traces"}
    assert Path(record["timeline_png"]).stat().st_size > 10_000
    # the timeline rebuilt from the snapshot reaches the peak the meter read in the same step
    timeline = build_timeline(load_snapshot(snapshot), phases=["forward", "backward"])
    assert timeline.active().max() / 2**30 == pytest.approx(record["snapshot_step_peak_gib"], rel=1e-6)
    # no rounding on CPUs
    assert record["snapshot_step_requested_peak_gib"] == record["snapshot_step_peak_gib"]
    top = record["top_allocations"]
    assert len(top) == 10 and top[0]["size_mib"] == record["top_alloc_mib"]
    assert [t["size_mib"] for t in top] == sorted((t["size_mib"] for t in top), reverse=True)
    # the largest: the logits (batch x seq x vocab fp32) made by the LM head, and their grads
    assert top[0]["size_mib"] == pytest.approx(3 * 45 * 10_000 * 4 / 2**20)
    assert any(t["site"].startswith("model/") for t in top)


def test_checkpointed_train_step_matches_the_model_except_cpu_adamw(tmp_path):
    record = run_point({**TINY, "mode": "train-step", "checkpoint": "block", "snapshot": False,
                        "artifacts_dir": str(tmp_path)})
    for phase in ("after_init", "forward_peak", "backward_peak", "step_peak"):
        _close(record, phase)
    assert record["checkpointed_blocks"] == 2
    # on CPU AdamW runs foreach with temporaries; the model is of the fused CUDA kernel (in place)
    assert record["optimizer_peak_gib"] >= record["predicted_optimizer_peak_gib"]
    assert "snapshot_path" not in record
    plain = run_point({**TINY, "mode": "train-step", "snapshot": False, "artifacts_dir": str(tmp_path)})
    assert record["step_peak_gib"] < plain["step_peak_gib"]


def test_autocast_forward_runs_and_reports_errors(tmp_path):
    record = run_point({**TINY, "mode": "forward", "precision": "bf16", "snapshot": False,
                        "artifacts_dir": str(tmp_path)})
    assert record["backward_peak_gib"] is None and record["backward_peak_error_pct"] is None
    assert record["forward_peak_error_pct"] is not None  # CPU autocast rules differ from CUDA's


def test_a_failed_snapshot_keeps_the_measured_peaks(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("no plot today")

    monkeypatch.setattr("lmscope.workloads.memory.plot_timeline", broken)
    record = run_point({**TINY, "mode": "forward", "artifacts_dir": str(tmp_path)})
    assert record["snapshot_error"] == "ValueError: no plot today"
    _close(record, "forward_peak")
    assert "timeline_png" not in record


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"checkpoint": "every:0"}, "checkpoint policy"),
        ({"steps": 0}, "steps must be at least 1"),
        ({"max_entries": 10}, "max_entries must be an integer from 1000"),
        ({"top": 0}, "top must be an integer from 1"),
        ({"artifacts_dir": " "}, "artifacts_dir is empty"),
        ({"mode": "inference"}, "unknown mode"),
    ],
)
def test_bad_points_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Spec(**{**TINY, **fields})


def test_command_runs_a_point_and_rejects_bad_flags(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    main(["memory", "--size", "tiny", "--device", "cpu", "--context-length", "16", "--batch-size", "2",
          "--mode", "forward", "--snapshot", "off", "--warmup", "1", "--steps", "1", "--out", str(out)])
    (record,) = read_records(out)
    assert record["workload"] == "memory" and record["status"] == "ok", record.get("error")
    assert abs(record["forward_peak_error_pct"]) < 1e-3
    assert "lmscope memory" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["memory", "--checkpoint", "sometimes", "--device", "cpu", "--size", "tiny",
              "--out", str(out)])
    assert exit_info.value.code == 2
    assert "checkpoint policy" in capsys.readouterr().err
