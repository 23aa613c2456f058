"""On a CUDA GPU: transformers and user models built on the device, compiled, with lmscope's flash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmscope.workloads.model_spec import ModelPointSpec
from lmscope.workloads.step import run_point
from lmscope.workloads.train_step import TrainStep

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ROOT = Path(__file__).resolve().parents[2]
OWN_LM = f"{ROOT / 'examples' / 'own_lm.py'}:build"


def test_factory_builds_on_the_device_and_compiles():
    row = run_point({"size": OWN_LM, "device": "cuda", "d_model": 256, "num_layers": 4, "num_heads": 4,
                     "context_length": 512, "batch_size": 4, "precision": "bf16", "compile": True,
                     "warmup": 2, "steps": 3, "target_ci": 0.0})
    assert row["model_source"] == "factory" and row["compile_s"] > 0 and row["tokens_per_s"] > 0
    assert row["peak_allocated_gib"] > 0


def test_hf_gqa_model_with_lmscope_flash_matches_sdpa_in_bf16(tmp_path):
    path = tmp_path / "gqa.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 512, "intermediate_size": 1024,
                                "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
                                "vocab_size": 1000}))
    losses = []
    for attention in ("sdpa", "flash"):
        spec = ModelPointSpec(size=f"hf:{path}", device="cuda", attention=attention, batch_size=2,
                              context_length=300, precision="bf16", mode="forward-backward")
        step = TrainStep(spec, seed=7)
        assert next(step.model.parameters()).device.type == "cuda"
        step()
        losses.append(step.last_loss.float().item())
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)
