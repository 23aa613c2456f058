"""BlockFrame: recipes rebuild cheap tensors in the backward, offloaded tensors come back, and what
stays is handed to the saved-tensor hooks around the block."""

from __future__ import annotations

import pytest
import torch
from host_copies import record_host_copies
from torch.multiprocessing.reductions import StorageWeakRef

from lmscope.model.offload import Offloader
from lmscope.model.saved_tensors import BlockFrame, rebuild_in_backward


def _graph(rebuild: bool, frame: BlockFrame | None, calls: list[str]) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)

    def sine(t: torch.Tensor) -> torch.Tensor:
        calls.append("rebuilt")
        return torch.sin(t)

    with frame or torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        s = x * 3  # saves nothing (a scalar factor)
        h = torch.sin(s)  # saves s
        if rebuild:
            rebuild_in_backward(h, sine, s)
        y = h @ w  # saves h and w
    (y.square().sum()).backward()
    return x.grad, w.grad


def test_a_recipe_saves_the_rebuild_instead_of_the_tensor():
    calls: list[str] = []
    reference = _graph(False, None, calls)
    seen: list[tuple[int, ...]] = []

    def outer_pack(t: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(outer_pack, lambda t: t):
        grads = _graph(True, BlockFrame(recipes=True, offload=None), calls)
    assert calls == ["rebuilt"]  # once, when the matmul's backward read h
    assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True))
    assert sorted(seen) == [(5, 3), (5, 7), (7, 3)]  # s, w (and y, outside) reach the outer hooks; h not


def test_outside_a_frame_with_recipes_nothing_changes():
    calls: list[str] = []
    _graph(True, None, calls)
    _graph(True, BlockFrame(recipes=False, offload=None), calls)
    assert calls == []


def test_a_target_whose_source_was_not_saved_stays_saved():
    calls: list[str] = []
    x = torch.randn(4, 6, requires_grad=True)
    with BlockFrame(recipes=True, offload=None):
        h = x.exp()  # saves its output, not x
        rebuild_in_backward(h, lambda t: calls.append("rebuilt") or t.exp(), x)
        y = (h * 2).sum()
    y.backward()
    assert calls == [] and torch.equal(x.grad, 2 * x.exp())


def test_offloaded_sources_feed_recipes_and_come_back_once(monkeypatch):
    calls: list[str] = []
    reference = _graph(False, None, calls)
    torch.manual_seed(0)
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    offloader = Offloader()
    frame = offloader.frame(0, torch.nn.Identity(), (x.unsqueeze(0),), {})  # tokens: batch 1, seq 5
    copies = record_host_copies(monkeypatch, weak=False)
    grads = _graph(True, BlockFrame(recipes=True, offload=frame), calls)
    assert calls == ["rebuilt"]
    assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True))
    (s,) = copies  # s, read by sin's backward and by the recipe of h
    assert s.loads == 1 and s.on_device is None


def _aliased(case: str, frame: BlockFrame | None, calls: list[str], seed: int) -> tuple[torch.Tensor, ...]:
    """A graph where a tensor at a recipe's address is not what the recipe names."""
    torch.manual_seed(seed)
    x = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 5, dtype=torch.float64, requires_grad=True)

    def sine(t: torch.Tensor) -> torch.Tensor:
        calls.append("rebuilt")
        return torch.sin(t)

    with frame or torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        s = x * 3
        h = torch.sin(s)  # saves s
        loss = s.sum()  # x gets a gradient in every case
        if case == "a transpose of the source saved at its address":
            loss = loss + (s.t() * w).sum()  # saves s.t()
        rebuild_in_backward(h, sine, s)
        if case == "the target changed in place":
            h.mul_(2)
        elif case == "another tensor at a dead target's address":
            storage = h.untyped_storage()
            del h  # the target dies; its memory goes to a tensor of other values (as the allocator may)
            torch.empty(0, dtype=torch.float64).set_(storage, 0, (5, 5), (5, 1)).fill_(0.5)
            h = torch.empty(0, dtype=torch.float64).set_(storage, 0, (5, 5), (5, 1)).requires_grad_()
        y = h @ w  # saves h
    (loss + y.square().sum()).backward()
    return x.grad, w.grad


@pytest.mark.parametrize(("case", "rebuilt"), [
    ("a transpose of the source saved at its address", True),  # rebuilt from s, not from s.t()
    ("the target changed in place", False),
    ("another tensor at a dead target's address", False),
])
def test_a_recipe_takes_only_its_target_and_its_sources(case, rebuilt):
    calls: list[str] = []
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    reference = _aliased(case, None, calls, seed)
    grads = _aliased(case, BlockFrame(recipes=True, offload=None), calls, seed)
    assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True)), case
    assert calls == (["rebuilt"] if rebuilt else [])


class _SavesRows(torch.autograd.Function):
    """exp(x), saving x as rows: a view made inside the op that dies when it returns (as the
    kernels that save their input as a 2-D reshape do)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x.reshape(-1, x.shape[-1]))
        return x.exp()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (rows,) = ctx.saved_tensors
        return grad * rows.exp().view(grad.shape)


def test_a_source_saved_as_a_view_that_dies_with_the_op_feeds_recipes():
    """Without outer hooks a saved tensor is kept detached; the source must still be found while
    its storage lives (SwiGLU saves gate_up as rows: its output was kept, not rebuilt)."""
    calls: list[str] = []
    x = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)

    def run(frame: BlockFrame | None) -> tuple[torch.Tensor, ...]:
        x.grad = w.grad = None
        with frame or torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            s = x * 2
            h = _SavesRows.apply(s)
            rebuild_in_backward(h, lambda rows: calls.append("rebuilt") or rows.exp(), s)
            y = h @ w  # saves h
        h_storage = StorageWeakRef(h.untyped_storage())
        del h
        freed = h_storage.expired()
        y.square().sum().backward()
        return freed, x.grad.clone(), w.grad.clone()

    kept, *reference = run(None)
    freed, *grads = run(BlockFrame(recipes=True, offload=None))
    assert not kept and freed and calls == ["rebuilt"]
    assert all(torch.equal(a, b) for a, b in zip(grads, reference, strict=True))
