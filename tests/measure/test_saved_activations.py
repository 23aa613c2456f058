"""Saved-for-backward bytes per block, module and op, measured with saved_tensors_hooks, on CPU."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmscope.accounting.flops import matmul_parameters
from lmscope.accounting.memory import saved_activations, saved_activations_by_group
from lmscope.config import ModelConfig
from lmscope.measure.saved_activations import NOT_UNPACKED, OUTSIDE, SavedActivations, unique_bytes
from lmscope.model.transformer import TransformerLM

ODD = ModelConfig(d_model=40, d_ff=104, num_layers=3, num_heads=4, vocab_size=83, context_length=64)


def _measure(model: nn.Module, tokens: torch.Tensor, autocast=contextlib.nullcontext) -> SavedActivations:
    saved = SavedActivations(model)
    with saved.recording():
        with autocast():
            logits = model(tokens)
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
    loss.backward()
    return saved


@pytest.mark.parametrize(("attention", "kernel"), [("naive", "naive"), ("sdpa", "flash")])
def test_each_block_saves_what_the_formula_says_exactly_in_fp32(attention, kernel):
    b, t = 3, 37
    model = TransformerLM(ODD, attention=attention)
    saved = _measure(model, torch.randint(0, ODD.vocab_size, (b, t)))
    groups = saved_activations_by_group(ODD, batch_size=b, seq_len=t, precision="fp32", attention=attention,
                                        kernel=kernel)
    by_block = saved.by("block")
    assert [by_block[f"layers.{i}"] for i in range(ODD.num_layers)] == [groups["block"]] * ODD.num_layers
    assert by_block["ln_final"] == groups["ln_final"] and by_block["lm_head"] == groups["lm_head"]
    assert by_block[OUTSIDE] == groups["loss"]  # cross-entropy runs outside the model
    total = saved_activations(ODD, batch_size=b, seq_len=t, precision="fp32", attention=attention,
                              kernel=kernel)["total"]
    assert saved.total_bytes == total == sum(by_block.values())
    assert sum(saved.by("op").values()) == total and NOT_UNPACKED not in saved.by("op")
    assert saved.by("op")["SiluBackward0"] == 3 * b * t * ODD.d_ff * 4  # w1 x for silu (x3 blocks)
    assert saved.weight_copy_bytes == 0
    assert saved.other_bytes > 0  # the token ids (embedding) and targets (loss), not activations


def test_gradients_by_block_are_the_parameter_bytes():
    model = TransformerLM(ODD)
    saved = _measure(model, torch.randint(0, ODD.vocab_size, (2, 11)))
    grads = saved.gradient_bytes()
    block = sum(p.numel() for p in model.layers[0].parameters()) * 4
    assert grads["layers.2"] == block and grads["token_embeddings"] == 4 * ODD.vocab_size * ODD.d_model
    assert sum(grads.values()) == 4 * sum(p.numel() for p in model.parameters())
    record = saved.as_record(top_ops=2)
    assert len(record["saved_by_op"]) == 2
    assert record["saved_by_op"][0]["saved_mib"] >= record["saved_by_op"][1]["saved_mib"]
    assert record["gradients_gib"] == pytest.approx(sum(grads.values()) / 2**30)


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


def test_bf16_weight_copies_are_told_apart_from_activations():
    from torch._subclasses.fake_tensor import FakeTensorMode

    b, t = 2, 29
    model = TransformerLM(ODD)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cuda")
        tokens = torch.randint(0, ODD.vocab_size, (b, t), device="cuda")
        saved = SavedActivations(model)
        with saved.recording():
            with _cuda_autocast_policy():
                logits = model(tokens)
            F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
    assert saved.weight_copy_bytes == 2 * matmul_parameters(ODD)  # every linear's bf16 weight, once
    assert saved.total_bytes == saved_activations(ODD, batch_size=b, seq_len=t, precision="bf16")["total"]
    # the one RoPE module all blocks share: its bf16 cos/sin casts belong to the block that called it
    block = saved_activations_by_group(ODD, batch_size=b, seq_len=t, precision="bf16")["block"]
    assert [saved.by("block")[f"layers.{i}"] for i in range(ODD.num_layers)] == [block] * ODD.num_layers
    assert saved.by("module")["layers.2.attn.rope"] == saved.by("module")["layers.0.attn.rope"] > 0


class _Twice(nn.Module):
    """Saves its input for two ops and a view of it for a third: one storage."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x)  # saves its output y
        return y * y + y.t().t().sin()  # mul saves y twice; sin saves a view of y


class _User(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.stem = nn.Linear(width, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width), _Twice()) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return x


def test_any_module_storages_count_once_and_blocks_are_module_list_entries():
    rows, width = 7, 13
    model = _User(width, depth=2)
    saved = SavedActivations(model)
    x = torch.randn(rows, width)
    with saved.recording():
        out = model(x)
    out.sum().backward()
    one = rows * width * 4
    # the stem keeps its input (for its weight's grad); block i keeps its Linear's input (the
    # previous output) and tanh's output y, saved by tanh, twice by mul and as a view by sin
    assert saved.by("block") == {"stem": one, "blocks.0": 2 * one, "blocks.1": 2 * one}
    assert saved.by("module") == {"stem": one, "blocks.0.0": one, "blocks.0.1": one, "blocks.1.0": one,
                                  "blocks.1.1": one}
    assert saved.other_bytes == 0 and saved.weight_copy_bytes == 0
    assert set(saved.by("op")) <= {"AddmmBackward0", "TanhBackward0", "MulBackward0", "SinBackward0"}


def test_unique_bytes_counts_each_storage_once():
    a = torch.zeros(10)
    assert unique_bytes([a, a[2:], a.view(2, 5), None, torch.zeros(3, dtype=torch.float64)]) == 40 + 24
