"""`lmscope attention`: latency, TFLOP/s, memory and error of one attention implementation at a point.

A point is an implementation (see `attention_impls`) and a shape: q, k, v are random normal
(batch, seq, d) tensors when heads == 1 (no head dim, as the classic study has them) and
(batch, heads, seq, d) otherwise, in the point's dtype, with requires_grad; dO is random normal.

What a point runs, in order:
1. one forward+backward, which also compiles (naive-compiled) or autotunes (flash-triton); up to
   `check_max_seq` its output and dQ, dK, dV are compared with a float64 reference on the same
   inputs (`max_error`, `max_grad_error`: max absolute differences), computed a few sequences at a
   time so the reference needs at most about 1 GiB per score matrix; above it `error_check` says
   "skipped: seq > N" and the errors are None;
2. on CUDA, one forward+backward with fresh peak statistics: memory in use after the forward
   (what is kept for the backward, inputs included, as the study reports it) and the peak, in
   MiB, and `saved_bytes_per_seq2` = (memory after the forward - memory before it) / seq^2, the
   seq^2 coefficient that naive attention pays and FlashAttention does not. Both memories are the
   point's own: allocated bytes beyond `baseline_allocated_mib`, what the process held (after
   garbage collection) before the point made its inputs; they include the inputs and what the
   point's first forward+backward left allocated (e.g. a cuBLAS workspace, made once per process:
   a point after others in the same process does not pay it again);
3. timings of the passes asked for: fwd = forward with autograd recording (as in training);
   bwd = `out.backward(dO, retain_graph=True)` on one forward's graph; fwd_bwd = forward then
   backward. On CUDA each is `triton.testing.do_bench` (L2 flushed before every call; median,
   p20, p80 of all its runs, `warmup_ms`/`rep_ms` are its warmup and rep in ms); on CPU, where
   do_bench cannot run, `cpu_steps` synchronized calls of lmscope's timer. `{pass}_times_ms`
   keeps the calls' times (at most `KEPT_TIMES`, evenly spaced over the run), from which
   `--compare` draws the confidence interval of a ratio. Gradients accumulate
   into q.grad, k.grad, v.grad across calls as in training (no `grad_to_none`), so bwd and
   fwd_bwd include the accumulation adds;
4. one more forward, whose autograd node's name is `autograd_node`: which path the timed calls
   took (flash-triton: "torch::autograd::CppNode<lmscope::FlashAttentionTritonNative>" for its
   C++ host path, "FlashAttentionTritonBackward" for its Python Function; SDPA: the backend's);
   for flash-triton also `flash_kernels`, which kernels ran ({"forward", "dq", "dkdv"} ->
   "gluon-sm90" for the Hopper Gluon kernels, "triton" for the Triton ones).

FLOPs (`attention_flops`): forward 4 * batch * heads * seq_q * seq_k * d (two matmuls),
halved when causal (the convention of the FlashAttention papers' benchmarks, not the exact
(seq + 1) / (2 seq)); backward 2.5 x forward (five matmuls to the forward's two, the recomputed
scores included); fwd_bwd 3.5 x forward. The same counts for every implementation, so TFLOP/s
compare like latency does.

Each point starts by freeing cached GPU memory and resetting peak statistics and ends by freeing
its tensors, so points that share one worker process do not influence each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lmscope.inputs.choices import check_device_name
from lmscope.inputs.limits import MAX_SIZE, MAX_TIMEOUT_S, check_size, check_steps
from lmscope.measure.memory import MemoryMeter
from lmscope.measure.timer import summarize, synchronize, time_steps
from lmscope.workloads.attention_grid import DTYPE_NAMES, check_dtype, check_impl, passes_in_order
from lmscope.workloads.attention_impls import prepare
from lmscope.workloads.train_step import device_facts, resolve_device

MIB = 2**20
DTYPES = {name: getattr(torch, attribute) for name, attribute in DTYPE_NAMES.items()}
BACKWARD_FLOP_FACTOR = 2.5
"""Backward FLOPs per forward FLOP: five seq x seq x d matmuls (S = Q K^T recomputed, dV = P^T dO,
dP = dO V^T, dQ = dS K, dK = dS^T Q) to the forward's two, the FlashAttention-2 benchmark
convention, applied to every implementation alike (naive attention keeps P and skips the
recomputation, so its own count is 2x: its TFLOP/s read as FlashAttention-equivalent)."""
KEPT_TIMES = 256
"""Per-call times a row keeps per pass (do_bench makes thousands of calls of a fast kernel)."""
REFERENCE_CHUNK_ELEMENTS = 2**27
"""Score-matrix elements per float64 reference call (2**27 * 8 bytes = 1 GiB)."""


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One attention implementation at one shape, dtype and masking, and how to time it."""

    impl: str = "naive"
    """Implementation: one of attention_grid.IMPL_NAMES."""
    batch: int = 8
    """Leading batch dim."""
    heads: int = 1
    """Heads; 1 means no head dim: tensors are (batch, seq, d)."""
    head_dim: int = 64
    """d, the size of each query/key/value vector."""
    seq_len: int = 1024
    """Queries = keys per sequence."""
    dtype: str = "fp32"
    """fp32 | bf16 | fp16: the dtype of q, k, v (no autocast)."""
    causal: bool = True
    """Query i attends keys j <= i."""
    passes: str = "fwd,bwd,fwd_bwd"
    """Which passes to time, a comma list of fwd, bwd, fwd_bwd."""
    warmup_ms: float = 25.0
    """do_bench warmup, in ms of running the pass (CUDA)."""
    rep_ms: float = 100.0
    """do_bench rep, in ms of timed runs (CUDA)."""
    cpu_steps: int = 3
    """Timed calls per pass on CPU."""
    check_max_seq: int = 4096
    """Largest seq_len checked against the float64 reference (0: never)."""
    seed: int = 0
    """Seed of the random inputs."""
    device: str = "auto"
    """'auto' (cuda when present, else cpu), 'cuda', 'cuda:N' or 'cpu'."""

    def __post_init__(self) -> None:
        check_impl(self.impl)
        for name in ("batch", "heads", "head_dim", "seq_len"):
            check_size(name, getattr(self, name))
        check_steps("cpu_steps", self.cpu_steps, 1, "calls")
        check_dtype(self.dtype)
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be true or false, got {self.causal!r}: pass --causal on|off")
        object.__setattr__(self, "passes", passes_in_order(self.passes))
        if not (0 <= self.warmup_ms <= MAX_TIMEOUT_S * 1e3 and 0 < self.rep_ms <= MAX_TIMEOUT_S * 1e3):
            raise ValueError(
                f"warmup_ms must be >= 0 and rep_ms > 0, both finite and at most a week, got "
                f"{self.warmup_ms}, {self.rep_ms}: "
                "pass --warmup-ms and --rep-ms in milliseconds"
            )
        if not isinstance(self.check_max_seq, int) or not 0 <= self.check_max_seq <= MAX_SIZE:
            raise ValueError(f"check_max_seq must be from 0 to {MAX_SIZE:,}, got {self.check_max_seq!r}: "
                             "pass --check-max-seq N (0: never)")
        check_device_name(self.device)

    @property
    def pass_list(self) -> list[str]:
        """The passes to time, in the order fwd, bwd, fwd_bwd."""
        return self.passes.split(",")

    def shape(self) -> tuple[int, ...]:
        """Shape of q, k and v."""
        lead = (self.batch,) if self.heads == 1 else (self.batch, self.heads)
        return (*lead, self.seq_len, self.head_dim)


def attention_flops(
    batch: int, heads: int, seq_q: int, seq_k: int, head_dim: int, causal: bool, which: str = "fwd"
) -> float:
    """FLOPs of one attention pass: fwd 4*B*H*Tq*Tk*d (halved when causal), bwd 2.5x, fwd_bwd 3.5x."""
    forward = 4.0 * batch * heads * seq_q * seq_k * head_dim * (0.5 if causal else 1.0)
    factors = {"fwd": 1.0, "bwd": BACKWARD_FLOP_FACTOR, "fwd_bwd": 1.0 + BACKWARD_FLOP_FACTOR}
    if which not in factors:
        raise ValueError(f"unknown pass {which!r}: choose one of {', '.join(factors)}")
    return forward * factors[which]


def _inputs(spec: Spec, device: torch.device) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator(device=device).manual_seed(spec.seed)
    dtype = DTYPES[spec.dtype]

    def randn() -> torch.Tensor:
        return torch.randn(spec.shape(), generator=generator, device=device, dtype=dtype)

    q, k, v = (randn().requires_grad_() for _ in range(3))
    return q, k, v, randn()


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.detach().reshape(-1, x.shape[-2], x.shape[-1])


def reference_errors(
    out: torch.Tensor, grads: list[torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    d_out: torch.Tensor, causal: bool,
) -> tuple[float, float]:
    """Max |out - O_ref| and max over dQ, dK, dV of |grad - grad_ref|, against float64."""
    from lmscope.kernels.attention_reference import attention_reference

    fq, fk, fv, fdo, fo = map(_flat, (q, k, v, d_out, out))
    fgrads = [_flat(g) for g in grads]
    chunk = max(1, REFERENCE_CHUNK_ELEMENTS // (q.shape[-2] * k.shape[-2]))
    out_error, grad_error = 0.0, 0.0
    for start in range(0, fq.shape[0], chunk):
        part = slice(start, start + chunk)
        leaves = [x[part].double().requires_grad_() for x in (fq, fk, fv)]
        ref, _ = attention_reference(*leaves, causal=causal)
        ref.backward(fdo[part].double())
        out_error = max(out_error, (fo[part].double() - ref).abs().max().item())
        for grad, leaf in zip(fgrads, leaves, strict=True):
            grad_error = max(grad_error, (grad[part].double() - leaf.grad).abs().max().item())
        del leaves, ref
    return out_error, grad_error


def _clear_grads(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        tensor.grad = None


def _bench(fn: Callable[[], Any], spec: Spec, device: torch.device) -> list[float]:
    """Every call's time in ms: do_bench on CUDA, lmscope's synchronized timer on CPU."""
    if device.type == "cuda":
        from triton.testing import do_bench

        times = do_bench(fn, warmup=spec.warmup_ms, rep=spec.rep_ms, return_mode="all")
        return [float(t) for t in times]  # a list or a tensor, by triton version
    # The first forward+backward of the point already warmed everything up.
    return time_steps(fn, warmup=0, steps=spec.cpu_steps, device=device)


def kept_times(times: list[float], limit: int = KEPT_TIMES) -> list[float]:
    """At most `limit` of `times`, evenly spaced over the run (all of them when there are fewer)."""
    if len(times) <= limit:
        return [round(t, 5) for t in times]
    stride = len(times) / limit
    return [round(times[int(i * stride)], 5) for i in range(limit)]


def _memory(attend: Callable[..., torch.Tensor], q, k, v, d_out, meter: MemoryMeter) -> dict[str, Any]:
    """Memory after the forward (kept for backward) and peak over forward+backward, in MiB, beyond
    the meter's baseline (bytes allocated before the point made its inputs)."""
    if not meter.cuda:
        return {"mem_before_backward_mib": None, "peak_mib": None, "saved_bytes_per_seq2": None}
    _clear_grads(q, k, v)
    meter.release()
    start = meter.current()  # the inputs, plus workspaces such as cuBLAS's
    out = attend(q, k, v)
    synchronize(meter.device)
    before = meter.current()
    out.backward(d_out)
    synchronize(meter.device)
    return {
        "mem_before_backward_mib": before / MIB,
        "peak_mib": meter.peak() / MIB,
        "saved_bytes_per_seq2": (before - start) / q.shape[-2] ** 2,
    }


def _timings(attend: Callable[..., torch.Tensor], q, k, v, d_out, spec: Spec, device) -> dict[str, Any]:
    """Latency and TFLOP/s of each pass asked for."""
    _clear_grads(q, k, v)
    metrics: dict[str, Any] = {}
    for which in spec.pass_list:
        if which == "fwd":
            times = _bench(lambda: attend(q, k, v), spec, device)
        elif which == "bwd":
            out = attend(q, k, v)
            times = _bench(lambda out=out: out.backward(d_out, retain_graph=True), spec, device)
            del out
        else:
            times = _bench(lambda: attend(q, k, v).backward(d_out), spec, device)
        stats = summarize(times)
        flops = attention_flops(spec.batch, spec.heads, spec.seq_len, spec.seq_len, spec.head_dim,
                                spec.causal, which)
        metrics.update({
            f"{which}_ms": stats.median_ms, f"{which}_p20_ms": stats.p20_ms,
            f"{which}_p80_ms": stats.p80_ms, f"{which}_tflops": flops / (stats.median_ms / 1e3) / 1e12,
            f"{which}_times_ms": kept_times(times),
        })
    return metrics


def _measure(spec: Spec, device: torch.device, meter: MemoryMeter) -> dict[str, Any]:
    baseline = meter.baseline_allocated if meter.cuda else None
    with prepare(spec.impl, device, DTYPES[spec.dtype], spec.head_dim, spec.causal) as attend:
        q, k, v, d_out = _inputs(spec, device)
        out = attend(q, k, v)
        out.backward(d_out)
        synchronize(device)
        metrics: dict[str, Any] = {"max_error": None, "max_grad_error": None,
                                   "baseline_allocated_mib": None if baseline is None else baseline / MIB}
        if spec.seq_len <= spec.check_max_seq:
            metrics["max_error"], metrics["max_grad_error"] = reference_errors(
                out, [q.grad, k.grad, v.grad], q, k, v, d_out, spec.causal
            )
            metrics["error_check"] = "float64 reference"
        else:
            metrics["error_check"] = f"skipped: seq > {spec.check_max_seq}"
        del out
        metrics.update(_memory(attend, q, k, v, d_out, meter))
        metrics.update(_timings(attend, q, k, v, d_out, spec, device))
        probe = attend(q, k, v)  # which autograd node the timed calls made (flash: C++ or Python)
        metrics["autograd_node"] = probe.grad_fn.name() if probe.grad_fn is not None else None
        del probe
        if spec.impl == "flash-triton":  # which kernels: the Gluon sm_90 ones or the Triton ones
            from lmscope.kernels.flash_attention import last_kernels

            metrics["flash_kernels"] = last_kernels()
    return metrics


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """Measure one point; see the module docstring for what and how."""
    spec = Spec(**point)
    device = resolve_device(spec.device)
    meter = MemoryMeter(device).take_baseline()  # on CUDA: what the process held before the point
    try:
        metrics = _measure(spec, device, meter)
    except Exception as error:
        # Drop the frames that hold this point's tensors, so that a worker reused for the next
        # point gets their memory back as soon as the runner has recorded the failure.
        error.__traceback__ = None
        raise
    finally:
        meter.release()
    return {
        **device_facts(device),
        "fwd_flops": attention_flops(spec.batch, spec.heads, spec.seq_len, spec.seq_len,
                                     spec.head_dim, spec.causal),
        **metrics,
    }
