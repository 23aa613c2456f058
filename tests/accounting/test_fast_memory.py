"""The fast model's memory accounting: what a block saves per treatment, by hand; the step's parts."""

from __future__ import annotations

import pytest

from lmscope.accounting.fast_memory import fast_dims, predict_fast_memory, saved_by_block
from lmscope.accounting.fsdp import predict_fsdp
from lmscope.config import ModelConfig

CONFIG = ModelConfig(d_model=24, d_ff=40, num_layers=3, num_heads=3, vocab_size=97, context_length=16)
POINT = dict(batch_size=2, seq_len=7, precision="bf16", attention="flash")


def test_a_block_saves_what_its_kernels_save_by_hand():
    s = fast_dims(CONFIG, weight_copies="casts", **POINT)
    tokens = 14
    saved = saved_by_block(s, "none")
    assert saved == {
        "residual": 2 * 4 * tokens * 24,  # the two norms' fp32 residuals
        "norm_rstd": 2 * 4 * tokens,
        "norm_output": 2 * 2 * tokens * 24,  # read by [Wq; Wk; Wv] and [w1; w3]
        "attention": 4 * 2 * tokens * 24,  # q, k, v, o
        "attention_rows": 4 * (64 + 2 * 3 * 7),  # L padded to 64 floats, then D
        "attention_copy": 0,  # flash's o is laid out for the output projection: a view
        "ffn": 2 * 2 * tokens * 40,  # gate_up
        "ffn_output": 2 * tokens * 40,  # read by w2
        "weight_copies": 2 * 24 * (72 + 24 + 80 + 40),  # all four matmuls cast their fp32 weights
    }
    selective = saved_by_block(s, "selective")
    assert sum(saved.values()) - sum(selective.values()) == 2 * 2 * tokens * 24 + 2 * tokens * 40
    assert saved_by_block(s, "full") == {"checkpoint_inputs": 4 * tokens * 24 + 2 * tokens * 24}
    sdpa = fast_dims(CONFIG, weight_copies="stacks", **{**POINT, "attention": "sdpa"})
    assert saved_by_block(sdpa, "none")["attention_copy"] == 2 * tokens * 24
    assert saved_by_block(sdpa, "none")["attention_rows"] == 4 * 2 * 3 * 7
    assert saved_by_block(sdpa, "none")["weight_copies"] == 2 * 24 * (72 + 80)  # the stacks only
    assert saved_by_block(fast_dims(CONFIG, **POINT), "none")["weight_copies"] == 0  # persistent copies


def test_offload_moves_the_activations_and_leaves_the_rest():
    none = predict_fast_memory(CONFIG, **POINT)
    offload = predict_fast_memory(CONFIG, checkpoint="offload", **POINT)
    assert offload.activations + offload.offloaded == none.activations
    s = fast_dims(CONFIG, **POINT)
    stays = CONFIG.num_layers * saved_by_block(s, "none")["attention_rows"]
    head = none.activations - CONFIG.num_layers * sum(saved_by_block(s, "none").values())
    assert offload.activations == stays + head
    assert offload.forward_peak < none.forward_peak and offload.static == none.static


@pytest.mark.parametrize("world_size", [1, 4])
def test_treatments_order_the_peaks(world_size):
    peaks = {policy: predict_fast_memory(CONFIG, checkpoint=policy, world_size=world_size, **POINT)
             for policy in ("none", "selective", "block", "selective+offload")}
    assert (peaks["none"].activations > peaks["selective"].activations > peaks["block"].activations
            and peaks["selective"].activations > peaks["selective+offload"].activations)
    assert all(p.step_peak == max(p.forward_peak, p.backward_peak) for p in peaks.values())


def test_under_fsdp_the_static_part_is_the_fsdp_accountings():
    fsdp = predict_fsdp(CONFIG, world_size=4, batch_size=2, seq_len=7, precision="bf16", fast=True)
    static = predict_fast_memory(CONFIG, world_size=4, **POINT).static
    rope_and_batch = 2 * 16 * (8 // 2) * 4 + 2 * 8 * 14
    assert static == (fsdp.params + fsdp.optimizer_state + max(fsdp.gathered_forward, fsdp.gathered_backward)
                      + rope_and_batch)
    with pytest.raises(ValueError, match="weight copies"):
        fast_dims(CONFIG, weight_copies="cached", **POINT)
