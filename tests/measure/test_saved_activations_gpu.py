"""On a CUDA GPU: saved activations per block against the formula, and a planned checkpoint (gpu)."""

from __future__ import annotations

import pytest
import torch

from lmscope.workloads.memory import run_point

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

POINT = {"size": "small", "device": "cuda", "batch_size": 2, "mode": "forward-backward", "precision": "bf16",
         "snapshot": False, "warmup": 1, "steps": 1}


@pytest.mark.parametrize(("attention", "context_length"), [("sdpa", 512), ("sdpa", 2048), ("naive", 512)])
def test_small_bf16_blocks_save_the_formula_within_five_percent(attention, context_length, tmp_path):
    record = run_point({**POINT, "attention": attention, "context_length": context_length,
                        "activations": True, "artifacts_dir": str(tmp_path)})
    blocks = [b for b in record["saved_by_block"] if b["block"].startswith("layers.")]
    assert len(blocks) == 12
    assert abs(record["saved_block_error_pct"]) < 5, blocks
    assert abs(record["saved_activations_error_pct"]) < 5
    assert record["saved_weight_copies_gib"] > 0  # bf16 copies of the linears, not activations
    parts = [v for k, v in record.items() if k.startswith("breakdown_") and k != "breakdown_peak_gib"]
    assert sum(parts) == pytest.approx(record["breakdown_peak_gib"], rel=1e-9)


def test_a_planned_checkpoint_fits_and_measures_near_its_prediction(tmp_path):
    point = {**POINT, "attention": "sdpa", "context_length": 1024, "artifacts_dir": str(tmp_path)}
    none = run_point(point)
    budget = 0.8 * none["predicted_step_peak_gib"]
    planned = run_point({**point, "checkpoint": f"plan:{budget:.3f}GiB"})
    assert planned["checkpointed_blocks"] > 0
    assert abs(planned["step_peak_error_pct"]) < 10
    assert planned["step_peak_gib"] < none["step_peak_gib"]
