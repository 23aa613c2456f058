"""The memory model: hand-computed cases, scaling laws, and the bytes autograd really saves."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from lmscope.accounting.flops import parameter_counts
from lmscope.accounting.memory import (
    GIB,
    checkpointed_blocks,
    predict_memory,
    saved_activations,
)
from lmscope.config import ModelConfig, preset
from lmscope.model.transformer import TransformerLM

ODD = ModelConfig(vocab_size=97, context_length=64, d_model=48, d_ff=80, num_layers=3, num_heads=3)
"""Odd sizes: head_dim 16, d_ff not a multiple of d_model, a prime vocabulary."""


def _hand_saved(config: ModelConfig, b: int, t: int, precision: str) -> int:
    """Naive attention, written out independently of the model: see the module docstring."""
    d, f, h, v, layers = config.d_model, config.d_ff, config.num_heads, config.vocab_size, config.num_layers
    btd, bt, btf, s = b * t * d, b * t, b * t * f, b * h * t * t
    if precision == "fp32":
        layer = 4 * (10 * btd + 2 * bt + 4 * btf + s) + t * t
        final = 4 * (3 * btd + bt)
    else:  # fp32 residual/norm tensors, bf16 casts and linear outputs, fp32 + bf16 probs, rope tables
        layer = 34 * btd + 8 * bt + 8 * btf + 6 * s + t * t + 4 * t * config.head_dim
        final = 10 * btd + 4 * bt
    return layers * layer + final + 4 * b * t * v


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize(("b", "t"), [(3, 40), (1, 64), (5, 17)])
def test_saved_activations_match_the_hand_count(precision, b, t):
    saved = saved_activations(ODD, batch_size=b, seq_len=t, precision=precision, attention="naive")
    assert saved["total"] == _hand_saved(ODD, b, t, precision)
    assert saved["total"] == sum(v for k, v in saved.items() if k != "total")


@pytest.mark.parametrize("size", ["small", "medium", "large", "xl", "2.7B"])
def test_parameter_bytes_are_exact(size):
    table = {"small": 128_625_408, "medium": 423_183_360, "large": 969_411_840,
             "xl": 1_998_235_200, "2.7B": 3_406_809_600}
    prediction = predict_memory(preset(size), batch_size=4, seq_len=128, mode="train-step", precision="fp32")
    assert prediction.components["parameters"] == 4 * table[size]
    assert prediction.components["gradients"] == 4 * table[size]


def test_adamw_state_is_two_copies_of_the_parameters():
    config = preset("small")
    params = 4 * parameter_counts(config)["total"]
    steps = 4 * (9 * config.num_layers + 3)  # one fp32 step counter per parameter tensor
    train = predict_memory(config, batch_size=4, seq_len=256, mode="train-step", precision="bf16")
    assert train.components["optimizer_state"] == 2 * params + steps
    # the optimizer phase holds parameters, their grads and the AdamW state (plus init tensors)
    assert train.optimizer_peak == train.after_init + params + 2 * params + steps
    fb = predict_memory(config, batch_size=4, seq_len=256, mode="forward-backward", precision="bf16")
    assert fb.components["optimizer_state"] == 0 and fb.optimizer_peak is None
    assert train.step_peak - fb.step_peak == 2 * params + steps


def test_after_init_is_parameters_rope_tables_and_batch():
    config = preset("tiny")
    p = predict_memory(config, batch_size=3, seq_len=100, mode="forward", precision="fp32")
    rope = 2 * config.context_length * config.head_dim // 2 * 4
    assert p.after_init == 4 * parameter_counts(config)["total"] + rope + 2 * 3 * 100 * 8


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_activations_are_affine_in_batch(precision, attention):
    def total(b):
        return saved_activations(ODD, batch_size=b, seq_len=32, precision=precision,
                                 attention=attention)["total"]

    step = total(2) - total(1)
    assert total(3) - total(2) == step
    assert total(7) - total(1) == 6 * step
    # what does not scale with the batch: the seq x seq mask and RoPE's cast tables, per layer
    fixed = 0
    if attention == "naive":
        fixed += ODD.num_layers * 32 * 32
    if precision == "bf16":
        fixed += ODD.num_layers * 4 * 32 * ODD.head_dim
    assert total(1) - step == fixed


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sdpa_keeps_what_its_cuda_kernel_keeps(precision):
    """SDPA on a GPU runs the memory-efficient kernel in fp32: its output (B, T, H, D) is viewed by
    the output projection (no copy) and its fp32 log-sum-exp has the rows padded to 32; in bf16
    the flash kernel: an exact log-sum-exp, and a copy of the (B, H, T, D) output for the
    projection. An odd sequence length shows the padding."""
    b, t = 2, 37
    saved = saved_activations(ODD, batch_size=b, seq_len=t, precision=precision, attention="sdpa")
    layers, h, d = ODD.num_layers, ODD.num_heads, ODD.d_model
    lse_rows, copy = (64, 0) if precision == "fp32" else (t, 2 * b * t * d)
    assert saved["attn_lse"] == layers * 4 * b * h * lse_rows
    assert saved.get("out_proj_input", 0) == layers * copy


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_naive_attention_is_quadratic_in_sequence_and_sdpa_linear(precision):
    config = ODD.replace(context_length=128)

    def total(attention, t):
        return saved_activations(config, batch_size=2, seq_len=t, precision=precision,
                                 attention=attention)["total"]

    t = 32  # multiples of 32 keep the memory-efficient kernel's log-sum-exp padding out of it
    second = total("naive", 3 * t) - 2 * total("naive", 2 * t) + total("naive", t)
    probs = 4 if precision == "fp32" else 6  # fp32 softmax output (+ its bf16 cast)
    per_t2 = config.num_layers * (probs * 2 * config.num_heads + 1)  # probs for every head + the bool mask
    assert second == 2 * t * t * per_t2
    assert total("sdpa", 3 * t) - 2 * total("sdpa", 2 * t) + total("sdpa", t) == 0


def test_residual_activation_of_the_study_question():
    config = preset("2.7B")
    fp32 = predict_memory(config, batch_size=4, seq_len=256, mode="forward", precision="fp32")
    assert fp32.residual_activation_bytes == 4 * 256 * 2560 * 4 == 10 * 2**20
    bf16 = predict_memory(config, batch_size=4, seq_len=256, mode="forward", precision="bf16")
    assert bf16.residual_activation_bytes == 5 * 2**20


def test_forward_mode_has_no_backward_and_autocast_adds_weight_copies():
    config = preset("2.7B")
    fp32 = predict_memory(config, batch_size=4, seq_len=128, mode="forward", precision="fp32")
    bf16 = predict_memory(config, batch_size=4, seq_len=128, mode="forward", precision="bf16")
    assert fp32.backward_peak is None and fp32.optimizer_peak is None
    assert fp32.step_peak == fp32.forward_peak
    counts = parameter_counts(config)
    matmul = counts["attention"] + counts["ffn"] + counts["lm_head"]
    assert bf16.components["autocast_copies"] == 2 * matmul
    assert fp32.components["autocast_copies"] == 0
    # the study's observation: a bf16 forward needs more than an fp32 one (the cached copies)
    assert bf16.forward_peak - fp32.forward_peak > 0.9 * 2 * matmul
    train = predict_memory(config, batch_size=4, seq_len=128, mode="train-step", precision="fp32")
    assert train.forward_peak > fp32.forward_peak


def test_checkpointing_trades_memory_in_the_expected_order():
    config = preset("small")
    peaks = {
        policy: predict_memory(config, batch_size=4, seq_len=512, mode="train-step", precision="fp32",
                               checkpoint=policy)
        for policy in ("none", "every:2", "block")
    }
    assert peaks["block"].step_peak < peaks["every:2"].step_peak < peaks["none"].step_peak
    assert peaks["block"].components["activations"] < peaks["none"].components["activations"]
    assert peaks["block"].components["recompute"] > 0
    assert "recompute" not in peaks["none"].components
    # parameters, gradients and optimizer state do not change
    assert peaks["block"].optimizer_peak == peaks["none"].optimizer_peak


def test_checkpoint_policies_parse():
    assert checkpointed_blocks("none", 5) == ()
    assert checkpointed_blocks("block", 3) == (0, 1, 2)
    assert checkpointed_blocks("every:3", 8) == (0, 3, 6)
    assert checkpointed_blocks("every:1", 2) == (0, 1)
    for bad in ("every:0", "every:", "every:x", "blocks", "all"):
        with pytest.raises(ValueError, match="checkpoint policy"):
            checkpointed_blocks(bad, 4)


def test_as_record_is_flat_gib_with_prefixes():
    p = predict_memory(preset("small"), batch_size=4, seq_len=128, mode="forward-backward", precision="fp32")
    record = p.as_record()
    assert all(key.startswith("predicted_") and key.endswith("_gib") for key in record)
    assert record["predicted_step_peak_gib"] == p.step_peak / GIB
    assert record["predicted_optimizer_peak_gib"] is None
    assert record["predicted_parameters_gib"] == p.components["parameters"] / GIB
    assert math.isclose(record["predicted_residual_activation_gib"], p.residual_activation_bytes / GIB)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "inference"}, "unknown mode"),
        ({"precision": "fp8"}, "unknown precision"),
        ({"attention": "linear"}, "unknown attention"),
        ({"checkpoint": "sometimes"}, "checkpoint policy"),
        ({"seq_len": 2048}, "exceeds the model's context_length"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
    ],
)
def test_bad_inputs_say_what_to_do(kwargs, message):
    args = {"batch_size": 2, "seq_len": 128, "mode": "train-step", "precision": "fp32"} | kwargs
    with pytest.raises(ValueError, match=message):
        predict_memory(preset("small"), **args)


# ------------------------------------------------------- measured: what autograd keeps on this machine


def _saved_bytes(model: torch.nn.Module, tokens: torch.Tensor, autocast) -> int:
    """Bytes of the distinct storages saved for backward by forward + loss (not weights, ids, scalars)."""
    own = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}
    keep = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        activation = tensor.is_floating_point() or tensor.dtype == torch.bool  # not the token ids
        if activation and tensor.dim() > 0 and storage._cdata not in own:
            seen[storage._cdata] = storage.nbytes()
        keep.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with autocast:
            logits = model(tokens)
        F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
    return sum(seen.values())


@pytest.mark.parametrize(("attention", "kernel"), [("naive", None), ("sdpa", "flash")])
def test_predicted_activations_equal_what_autograd_saves_on_cpu(attention, kernel):
    # CPU SDPA lays its output out as (B, H, T, D) like the flash kernel, hence kernel="flash"
    torch.manual_seed(0)
    model = TransformerLM(ODD, attention=attention)
    b, t = 3, 37
    tokens = torch.randint(0, ODD.vocab_size, (b, t))
    measured = _saved_bytes(model, tokens, contextlib.nullcontext())
    predicted = saved_activations(ODD, batch_size=b, seq_len=t, precision="fp32", attention=attention,
                                  kernel=kernel)["total"]
    assert predicted == measured


@contextlib.contextmanager
def _cuda_autocast_policy():
    """CUDA's autocast rules on fake CUDA tensors (no GPU needed): softmax in fp32, casts cached."""
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.bfloat16)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled("cuda", False)


def test_predicted_bf16_activations_follow_cudas_autocast_rules():
    from torch._subclasses.fake_tensor import FakeTensorMode

    model = TransformerLM(ODD)
    b, t = 2, 29
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cuda")  # fake CUDA tensors: shapes and dtypes, no values
        tokens = torch.randint(0, ODD.vocab_size, (b, t), device="cuda")
        measured = _saved_bytes(model, tokens, _cuda_autocast_policy())
    counts = parameter_counts(ODD)
    copies = 2 * (counts["attention"] + counts["ffn"] + counts["lm_head"])  # saved by the matmuls too
    predicted = saved_activations(ODD, batch_size=b, seq_len=t, precision="bf16")["total"]
    assert predicted + copies == measured
