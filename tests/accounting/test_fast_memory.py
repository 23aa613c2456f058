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


@pytest.mark.parametrize("world_size", [2, 5])
@pytest.mark.parametrize("checkpoint", ["none", "blocks:0+selective:1-2+offload:0"])
def test_host_optimizer_state_lowers_the_static_part_and_the_peaks_by_the_moments_it_moves(world_size,
                                                                                          checkpoint):
    point = dict(POINT, world_size=world_size, checkpoint=checkpoint)
    device, host = (predict_fast_memory(CONFIG, optimizer_state=where, **point)
                    for where in ("device", "host"))
    fsdp = {where: predict_fsdp(CONFIG, world_size=world_size, batch_size=2, seq_len=7, precision="bf16",
                                fast=True, optimizer_state=where) for where in ("device", "host")}
    moved = fsdp["device"].optimizer_state - fsdp["host"].optimizer_state - fsdp["host"].optimizer_in_flight
    assert moved > 0
    assert device.static - host.static == moved
    assert device.forward_peak - host.forward_peak == moved
    # the backward also keeps no fp32 shard gradients: lower by at least the moments
    assert device.backward_peak - host.backward_peak >= moved
    assert device.step_peak - host.step_peak >= moved
    assert (device.activations, device.offloaded) == (host.activations, host.offloaded)


def test_host_optimizer_state_needs_fsdp_and_a_known_placement():
    with pytest.raises(ValueError, match="host optimizer state needs FSDP over 2 or more ranks"):
        predict_fast_memory(CONFIG, optimizer_state="host", **POINT)
    with pytest.raises(ValueError, match="unknown optimizer state 'cloud'"):
        predict_fast_memory(CONFIG, optimizer_state="cloud", **POINT)


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_fused_loss_adds_one_chunk_of_logits_and_no_weight_gradient_part(world_size):
    """Each chunk's matmul accumulates into the held d(weight) (cuBLAS beta = 1): at the loss's peak
    the forward's end level has only h, the per-token losses, the head's cast (one device: fp32
    weight, bf16 matmuls) and one chunk of logits on top, no (V, d) part per chunk."""
    wide = CONFIG.replace(vocab_size=4099)  # the loss holds the forward's peak
    predicted = predict_fast_memory(wide, world_size=world_size, **POINT)
    tokens, d, vocab, c = 14, 24, 4099, 2
    cast = c * vocab * d if world_size == 1 else 0
    loss_peak = c * tokens * d + 4 * tokens + cast + c * tokens * vocab
    assert predicted.forward_peak == predicted.static + predicted.activations + loss_peak
