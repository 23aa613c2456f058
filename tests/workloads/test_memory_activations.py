"""`memory --activations` on CPU: saved bytes per block beside the formula, the peak's breakdown
adding up from counted tensors, the planner's plan run and measured, and the commands."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lmscope.accounting.checkpoint_plan import plan_checkpointing
from lmscope.accounting.flops import parameter_counts
from lmscope.accounting.memory import GIB
from lmscope.accounting.treatments import checkpoint_values
from lmscope.cli import main
from lmscope.config import preset
from lmscope.records.results import append_record
from lmscope.report.memory_plots import show_saved_activations
from lmscope.workloads.memory import Spec, run_point

TINY = {"size": "tiny", "device": "cpu", "batch_size": 3, "context_length": 45, "snapshot": False,
        "warmup": 1, "steps": 1}
BYTE = 1 / GIB


def test_train_step_breakdown_adds_up_from_counted_tensors(tmp_path):
    record = run_point({**TINY, "mode": "train-step", "activations": True, "artifacts_dir": str(tmp_path)})
    params = 4 * parameter_counts(preset("tiny"))["total"]
    tensors = 9 * 2 + 3
    assert record["breakdown_parameters_gib"] == params / GIB
    assert record["breakdown_gradients_gib"] == 0  # set_to_none before the step
    # AdamW: exp_avg and exp_avg_sq per parameter, and a 4-byte step count per tensor (CPU)
    assert record["breakdown_optimizer_state_gib"] == (2 * params + 4 * tensors) / GIB
    assert record["breakdown_activations_gib"] == record["saved_activations_gib"]
    assert record["saved_activations_error_pct"] == 0 and record["saved_block_error_pct"] == 0
    # the rest alive at the end of the forward: token ids and targets, RoPE tables, the loss
    batch, rope = 2 * 3 * 45 * 8, 2 * 45 * 8 * 4
    assert record["breakdown_other_gib"] == pytest.approx((batch + rope) / GIB, abs=16 * BYTE)
    parts = [v for k, v in record.items() if k.startswith("breakdown_") and k != "breakdown_peak_gib"]
    assert sum(parts) == pytest.approx(record["breakdown_peak_gib"], abs=BYTE)
    assert record["breakdown_peak_gib"] == pytest.approx(record["step_peak_gib"], abs=64 * BYTE)
    assert record["breakdown_after_forward_gib"] > 0  # the gradients arrive in the backward
    assert record["gradients_gib"] == params / GIB
    blocks = [b for b in record["saved_by_block"] if b["block"].startswith("layers.")]
    assert len(blocks) == 2 and all(b["error_pct"] == 0 for b in blocks)
    assert record["saved_by_op"][0]["op"] == "NllLossBackward0"  # the fp32 log-softmax, the largest


def test_a_checkpointed_block_keeps_its_input_only(tmp_path):
    record = run_point({**TINY, "mode": "forward-backward", "attention": "sdpa", "checkpoint": "blocks:0",
                        "activations": True, "artifacts_dir": str(tmp_path)})
    first = record["saved_by_block"][0]
    assert first["block"] == "layers.0" and first["saved_mib"] == 3 * 45 * 64 * 4 / 2**20
    assert record["saved_activations_error_pct"] == 0 and record["checkpoint_policy"] == "blocks:0"


def test_a_planned_checkpoint_runs_the_chosen_blocks_and_measures_the_predicted_peak(tmp_path):
    config = preset("tiny", context_length=45)
    point = dict(batch_size=3, seq_len=45, mode="forward-backward", precision="fp32", attention="naive")
    none = plan_checkpointing(config, budget=2**40, **point).candidates[0].peak
    budget = none - 200_000
    chosen = plan_checkpointing(config, budget=budget, **point).chosen
    assert chosen.policy != "none"
    record = run_point({**TINY, "mode": "forward-backward", "checkpoint": f"plan:{budget}B",
                        "artifacts_dir": str(tmp_path)})
    assert record["checkpoint_policy"] == chosen.policy
    assert record["checkpoint_budget_gib"] == budget / GIB
    assert record["predicted_step_peak_gib"] == chosen.peak / GIB
    assert record["predicted_recompute_share_pct"] == chosen.recompute_share_pct > 0
    assert record["step_peak_gib"] <= budget / GIB
    assert abs(record["step_peak_error_pct"]) < 1


@pytest.mark.parametrize(("fields", "message"), [
    ({"activations": True, "mode": "forward"}, "forward-backward or train-step"),
    ({"checkpoint": "plan:1KiB"}, "no checkpointing plan fits"),
    ({"checkpoint": "plan:lots"}, "memory size"),
])
def test_bad_activation_points_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        Spec(**{**TINY, **fields})


def test_checkpoint_lists_keep_block_lists_whole():
    assert checkpoint_values("none,block,every:2") == ["none", "block", "every:2"]
    assert checkpoint_values("blocks:0-3,7") == ["blocks:0-3,7"]
    assert checkpoint_values("none; blocks:0,2") == ["none", "blocks:0,2"]


def test_tables_then_a_plan_from_the_measured_row(tmp_path, capsys):
    point = {**TINY, "context_length": 16, "batch_size": 2, "mode": "forward-backward", "activations": True,
             "artifacts_dir": str(tmp_path)}
    record = {**dataclasses.asdict(Spec(**point)), **run_point(point), "workload": "memory", "status": "ok"}
    show_saved_activations([record])
    printed = capsys.readouterr().out
    assert "saved for backward, by block" in printed and "the step's peak, by part" in printed
    out = tmp_path / "results.jsonl"
    append_record(out, record)
    main(["plan", "checkpoint", "--from", str(out), "--budget", "1GiB", "--format", "json"])
    sections = json.loads(capsys.readouterr().out)["sections"]
    assert sections["setup"][0]["source"] == "measured" and sections["chosen"][0]["policy"] == "none"
    assert sections["candidates"][0]["predicted_peak_gib"] == record["step_peak_gib"]
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "checkpoint", "--from", str(out), "--budget", "1GiB", "--precision", "bf16"])
    assert exit_info.value.code == 2 and "no memory --activations rows" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "checkpoint", "--model", "xl-2025", "--budget", "40GiB"])
    assert exit_info.value.code == 2
    assert "smallest predicted peak" in capsys.readouterr().err
