"""Offloader on the CPU: which saved tensors move, one copy per storage, views come back as they were,
each copy comes back once, and a step's copies are freed by its backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from host_copies import alive, record_host_copies, without_cyclic_gc
from torch import nn

from lmscope.config import ModelConfig
from lmscope.model.checkpointing import apply_checkpointing, checkpoint_blocks
from lmscope.model.offload import Offloader
from lmscope.model.transformer import TransformerLM


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8, bias=False)
        self.register_buffer("table", torch.randn(5, 4))


def _frame(block: nn.Module, x: torch.Tensor, *extra: torch.Tensor, index: int = 0, offloader=None):
    return (offloader or Offloader()).frame(index, block, (x, *extra), {})


def test_activations_move_weights_tables_and_other_shapes_stay():
    block = _Block()
    x = torch.randn(3, 5, 8, requires_grad=True)  # batch 3, seq 5
    cos = torch.randn(5, 4)  # an input that needs no grad
    frame = _frame(block, x, cos)
    assert frame.takes(x * 2)  # (batch, seq, d)
    assert frame.takes(torch.randn(3, 2, 5, 4))  # (batch, heads, seq, head_dim)
    assert frame.takes(torch.randn(6, 5, 4))  # (batch * heads, seq, head_dim)
    assert frame.takes(torch.randn(15))  # one value per token
    assert not frame.takes(torch.randn(4, 8))  # no token dims
    assert not frame.takes(block.proj.weight)  # a parameter
    assert not frame.takes(block.proj.weight.to(torch.bfloat16).t())  # a cast and view of one
    assert not frame.takes(block.table) and not frame.takes(cos)  # a buffer, an input without grad
    assert not frame.takes(torch.ones(3, 5, 8, dtype=torch.long))  # not floating
    assert not Offloader().frame(0, block, (torch.randn(8),), {}).takes(x * 2)  # no batch, seq known


def test_views_of_one_storage_share_one_copy_and_come_back_bitwise():
    base = torch.randn(3, 5, 8)
    frame = _frame(_Block(), base)
    whole, half = frame.pack(base), frame.pack(base[:, :, 4:])
    assert whole.copy is half.copy  # one host copy per storage
    back = half.unpack()
    assert torch.equal(back, base[:, :, 4:]) and back.stride() == base[:, :, 4:].stride()
    assert back.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()  # a copy, not the tensor
    assert whole.copy.on_device is not None  # one unpack left: the device copy stays
    assert torch.equal(whole.unpack(), base)
    assert whole.copy.on_device is None  # every tensor of it unpacked: let go


def test_the_next_blocks_backward_brings_the_previous_blocks_copies():
    offloader = Offloader()
    x0 = torch.randn(2, 3, 8, requires_grad=True)
    first = _frame(_Block(), x0, offloader=offloader, index=0)
    saved = first.pack(x0 * 3)
    first.finish_forward(x0)
    out0 = x0 * 2
    second = _frame(_Block(), out0, offloader=offloader, index=1)
    assert second.previous is first
    second.pack(out0 * 5)
    out1 = out0 * 7
    second.finish_forward(out1)
    assert saved.copy.on_device is None  # nothing loaded before the backward
    out1.sum().backward()  # the gradient of block 1's output arrives: both blocks load
    assert saved.copy.on_device is not None
    assert _frame(_Block(), x0, offloader=offloader, index=5).previous is None  # not the block before


@pytest.mark.parametrize("policy", ["offload", "block+offload", "selective:1+offload:0-1"])
def test_a_steps_copies_are_freed_by_its_backward_without_the_cyclic_gc(monkeypatch, policy):
    made = record_host_copies(monkeypatch)
    config = ModelConfig(vocab_size=53, context_length=16, d_model=24, d_ff=40, num_layers=3, num_heads=3)
    model = TransformerLM(config)
    apply_checkpointing(model, policy)
    tokens = torch.randint(0, config.vocab_size, (2, 9))
    with without_cyclic_gc():
        for step in range(2):
            made.clear()
            loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
            assert alive(made), "nothing was offloaded"
            loss.backward()  # `loss` still holds the graph, as a training loop's variable does
            assert alive(made) == [], (policy, step)


class _Fork(torch.autograd.Function):
    """(y, 2y) from one node, as the fast block's second add_rmsnorm gives its residual and the
    FFN's input: the first output's gradient is used only when the node runs, after the backward
    through the second output's path has read (and let go of) its saved tensors."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return y.clone(), y * 2

    @staticmethod
    def backward(ctx, dx: torch.Tensor, dh: torch.Tensor) -> torch.Tensor:
        return dx + 2 * dh


class _TwoOutputBlock(nn.Module):
    """forward(x, pending) -> (x, pending), the fast block's signature (pending: the FFN's output)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.inner, self.outer = nn.Linear(d, d, dtype=torch.float64), nn.Linear(d, d, dtype=torch.float64)

    def forward(self, x: torch.Tensor, pending: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, h = _Fork.apply(torch.tanh(self.inner(x + pending)))
        return x, self.outer(torch.sigmoid(h))


def _two_output_step(policy: str, seed: int, backwards: int = 1) -> list[torch.Tensor]:
    """The input's and parameters' gradients of three `_TwoOutputBlock`s under `policy`."""
    torch.manual_seed(seed)
    blocks = nn.ModuleList(_TwoOutputBlock(8) for _ in range(3))
    checkpoint_blocks(blocks, policy)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)  # batch 3, seq 5
    out, pending = x, torch.zeros_like(x)
    for block in blocks:
        out, pending = block(out, pending)
    loss = (out + pending).square().sum()
    for _ in range(backwards):
        loss.backward(retain_graph=backwards > 1)
    return [x.grad] + [p.grad for p in blocks.parameters()]


def test_each_copy_comes_back_once_and_nothing_stays_on_the_device(monkeypatch):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    reference = _two_output_step("none", seed)
    copies = record_host_copies(monkeypatch, weak=False)
    grads = _two_output_step("offload", seed)
    assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True))
    assert len(copies) == 3 * 3  # per block: x + pending, tanh's output, sigmoid's
    assert [c for c in copies if c.on_device is not None] == []  # nothing held after the backward
    assert [c.loads for c in copies] == [1] * len(copies)  # none brought back twice


def test_a_retained_graph_brings_the_copies_back_for_each_backward():
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    reference = _two_output_step("none", seed, backwards=2)
    grads = _two_output_step("offload", seed, backwards=2)
    assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True))
