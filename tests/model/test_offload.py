"""Offloader on the CPU: which saved tensors move, one copy per storage, views come back as they were."""

from __future__ import annotations

import torch
from torch import nn

from lmscope.model.offload import Offloader


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
