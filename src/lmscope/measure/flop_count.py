"""FLOPs of any model's step, counted by torch's FlopCounterMode with lmscope's attention formulas.

Convention (the one of `lmscope.accounting.flops`, so a preset's count equals the analytic one):

* a multiply-add is 2 FLOPs and only matrix products count (torch's registered formulas: mm,
  addmm, bmm, baddbmm, convolutions, attention); elementwise ops, norms, softmax, the loss and
  embedding lookups count 0;
* these are model FLOPs: attention counts its two forward matmuls (Q K^T and P V) and four
  backward ones (dP, dV, dQ, dK), never the recomputation of the scores a fused kernel does in
  its backward (torch's own SDPA backward formula counts that recomputation: it is replaced);
* causal attention counts its unmasked (query, key) pairs only, sum over queries i of
  min(i + 1, n_keys) (the top-left convention of SDPA's is_causal; about half the square), as
  `lmscope.accounting.flops` does (`flops`): the model FLOPs MFU is taken on. The count with the
  full square, what naive attention computes, is kept beside it (`flops_full_square`);
* lmscope's own FlashAttention (Triton and tiled-PyTorch autograd Functions) counts by the same
  attention formula, and the matmuls inside it are not counted a second time;
* whatever a phase runs is counted in it: the optimizer phase counts what its ops have formulas
  for (0 for AdamW, elementwise only); with activation checkpointing, the forward recomputed
  inside the backward is counted in the backward (hardware FLOPs, not model FLOPs).

Known gaps: attention written as plain matmuls plus a mask (lmscope's `naive` backend) is
counted as matmuls, the full square in both counts (above the model FLOPs: its
`flops_counted_error` shows by how much); SDPA given an explicit mask instead of
is_causal counts the full square in both; nested/varlen attention keeps torch's formulas; Triton
or CUDA kernels other than lmscope's FlashAttention count 0. Count on an eager model: compiled
graphs and CUDA-graph replays do not dispatch their ops to the counter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, shape_wrapper

from lmscope.accounting.flops import causal_pairs

_SDPA_OPS = (
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_cudnn_attention",
)


def attention_flops(
    q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int], *,
    causal: bool, backward: bool, causal_half: bool,
) -> int:
    """Model FLOPs of softmax(Q K^T) V on (..., heads, n, d) shapes (GQA: fewer key/value heads).

    Forward: 2 * pairs * (d_qk + d_v) per query head; backward: twice that. `pairs` is
    n_queries * n_keys, or `causal_pairs` when `causal and causal_half`.
    """
    *lead, n_q, d_qk = q_shape
    n_k, d_v = k_shape[-2], v_shape[-1]
    heads = 1
    for size in lead:
        heads *= int(size)
    pairs = causal_pairs(n_q, n_k) if causal and causal_half else n_q * n_k
    forward = 2 * heads * pairs * (d_qk + d_v)
    return 2 * forward if backward else forward


def _matmul_flops(a_shape: Sequence[int], b_shape: Sequence[int]) -> int:
    """2 * m * n * k per matrix of (..., m, k) @ (..., k, n)."""
    *batch, m, k = a_shape
    n = b_shape[-1]
    count = 2 * m * n * k
    for size in batch:
        count *= int(size)
    return count


def _with_bias_flops(bias_shape: Sequence[int], a_shape: Sequence[int], b_shape: Sequence[int],
                     *rest: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """addmm / baddbmm: the product's FLOPs, whatever follows the three tensors (torch 2.11's own
    formulas take no positional `out_dtype`, which Liger-Kernel's fused cross-entropy passes)."""
    return _matmul_flops(a_shape, b_shape)


def _plain_flops(a_shape: Sequence[int], b_shape: Sequence[int], *rest: Any, out_shape: Any = None,
                 **kwargs: Any) -> int:
    """mm / bmm, with or without `out_dtype`."""
    return _matmul_flops(a_shape, b_shape)


_OUT_DTYPE_FORMULAS = {
    torch.ops.aten.addmm: _with_bias_flops, torch.ops.aten.baddbmm: _with_bias_flops,
    torch.ops.aten.mm: _plain_flops, torch.ops.aten.bmm: _plain_flops,
}
"""Matmul formulas that accept the `out_dtype` overloads' extra positional argument."""


@dataclass
class PhaseFlops:
    """FLOPs of one phase: model FLOPs (causal pairs), the full-square count, attention's part
    (full square)."""

    flops: int = 0
    flops_full_square: int = 0
    attention_flops: int = 0


@dataclass
class FlopCount:
    """FLOPs per phase of one step, in the order the phases ran."""

    phases: dict[str, PhaseFlops] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Model FLOPs of the step: causal attention as its unmasked pairs (lmscope.accounting's
        convention, the one MFU is taken on)."""
        return sum(p.flops for p in self.phases.values())

    @property
    def total_full_square(self) -> int:
        """FLOPs of the step with causal attention as the full square."""
        return sum(p.flops_full_square for p in self.phases.values())

    def as_record(self) -> dict[str, Any]:
        """Row keys: flops_per_step_counted(_full_square) and {phase}_flops per phase."""
        return {
            "flops_per_step_counted": float(self.total),
            "flops_per_step_counted_full_square": float(self.total_full_square),
            **{f"{name}_flops": float(p.flops) for name, p in self.phases.items()},
        }


class AttentionAwareCounter(FlopCounterMode):
    """FlopCounterMode whose attention formulas follow the convention above.

    Enter it once per phase; `phase_flops()` then gives the phase's counts. While a lmscope
    FlashAttention Function runs inside it, its formula counts once and the ops inside count 0.
    """

    def __init__(self) -> None:
        super().__init__(display=False)
        self._quiet = 0
        self._square = 0
        self._causal = 0
        self.flop_registry = {op: self._gated(fn) for op, fn in self.flop_registry.items()}
        for packet, formula in _OUT_DTYPE_FORMULAS.items():
            self.flop_registry[packet] = self._gated(shape_wrapper(formula))
        for name in _SDPA_OPS:
            for backward in (False, True):
                packet = getattr(torch.ops.aten, name + ("_backward" if backward else ""), None)
                if packet is not None:
                    self.flop_registry[packet] = self._sdpa_formula(packet, backward)

    def __enter__(self) -> AttentionAwareCounter:
        self._square = self._causal = 0
        super().__enter__()
        return self

    def _gated(self, fn: Callable[..., int]) -> Callable[..., int]:
        def counted(*args: Any, **kwargs: Any) -> int:
            return 0 if self._quiet else fn(*args, **kwargs)

        return counted

    def add_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                      causal: bool, backward: bool) -> int:
        """Tally one attention call; returns its full-square FLOPs (FlopCounterMode's own total)."""
        shapes = (q.shape, k.shape, v.shape)
        square = attention_flops(*shapes, causal=causal, backward=backward, causal_half=False)
        self._square += square
        self._causal += attention_flops(*shapes, causal=causal, backward=backward, causal_half=True)
        return square

    def _sdpa_formula(self, packet: Any, backward: bool) -> Callable[..., int]:
        names = [a.name for a in packet.default._schema.arguments]

        def formula(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
            if self._quiet:
                return 0
            bound = dict(zip(names, args, strict=False)) | kwargs
            return self.add_attention(bound["query"], bound["key"], bound["value"],
                                      causal=bool(bound.get("is_causal", False)), backward=backward)

        return formula

    @contextlib.contextmanager
    def counted_as_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                             causal: bool, backward: bool) -> Iterator[None]:
        """Count the code inside as one attention call: its formula once, its own ops not at all."""
        self.flop_counts["Global"]["lmscope.flash_attention"] += self.add_attention(
            q, k, v, causal=causal, backward=backward)
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def phase_flops(self) -> PhaseFlops:
        """Counts since the last enter."""
        total = self.get_total_flops()
        return PhaseFlops(flops=total - self._square + self._causal, flops_full_square=total,
                          attention_flops=self._square)


@contextlib.contextmanager
def _flash_functions_counted(counter: AttentionAwareCounter) -> Iterator[None]:
    """While inside, lmscope's FlashAttention Functions report to `counter` by formula (the
    Triton one through its Python Function: the C++ host path is off meanwhile)."""
    from lmscope.kernels.flash_attention import FlashAttentionTriton, python_path
    from lmscope.kernels.flash_attention_torch import FlashAttentionTorch

    saved = []
    for cls in (FlashAttentionTriton, FlashAttentionTorch):
        forward, backward = cls.forward, cls.backward

        def counted_forward(ctx, q, k, v, is_causal=False, *rest, _forward=forward):
            ctx.lmscope_shapes = (q.detach(), k.detach(), v.detach(), bool(is_causal))
            with counter.counted_as_attention(q, k, v, causal=bool(is_causal), backward=False):
                return _forward(ctx, q, k, v, is_causal, *rest)

        def counted_backward(ctx, *grads, _backward=backward):
            q, k, v, causal = ctx.lmscope_shapes
            with counter.counted_as_attention(q, k, v, causal=causal, backward=True):
                return _backward(ctx, *grads)

        saved.append((cls, forward, backward))
        cls.forward, cls.backward = staticmethod(counted_forward), staticmethod(counted_backward)
    try:
        with python_path():
            yield
    finally:
        for cls, forward, backward in saved:
            cls.forward, cls.backward = staticmethod(forward), staticmethod(backward)


class CountingClock:
    """A PhaseClock stand-in: `start()` opens the counter, each `mark(name)` closes phase `name`.

    Pass it to any step that marks its phases on a clock (`TrainStep.__call__(clock)`); code
    before `start()` and after the last mark is not counted.
    """

    def __init__(self, counter: AttentionAwareCounter) -> None:
        self._counter = counter
        self._open = False
        self.result = FlopCount()

    def start(self) -> None:
        """Open the first phase."""
        self._close()
        self._counter.__enter__()
        self._open = True

    def mark(self, name: str) -> None:
        """Close the phase called `name` and open the next one."""
        phase = self._close()
        if phase is not None:
            self.result.phases[name] = phase
        self._counter.__enter__()
        self._open = True

    def _close(self) -> PhaseFlops | None:
        if not self._open:
            return None
        self._counter.__exit__(None, None, None)
        self._open = False
        return self._counter.phase_flops()

    def finish(self) -> FlopCount:
        """Close the counter (what ran after the last mark is dropped) and return the counts."""
        self._close()
        return self.result


def count_step(step: Callable[[Any], Any]) -> FlopCount:
    """Run `step(clock)` once and count the FLOPs of each phase it marks on the clock."""
    counter = AttentionAwareCounter()
    clock = CountingClock(counter)
    with _flash_functions_counted(counter):
        try:
            step(clock)
        finally:
            result = clock.finish()
    return result


def count_phases(phases: Sequence[tuple[str, Callable[[], Any]]]) -> FlopCount:
    """Run each (name, fn) in order once and count the FLOPs of each."""

    def step(clock: CountingClock) -> None:
        clock.start()
        for name, run in phases:
            run()
            clock.mark(name)

    return count_step(step)
