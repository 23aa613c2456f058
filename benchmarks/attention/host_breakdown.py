"""Where the host time of one eager FlashAttention forward+backward goes, piece by piece.

host_overhead.py times whole calls; this script times their parts at one shape, each as the
host time per call of many unsynchronized calls (the GPU keeps up at small shapes, so the host
is the bottleneck): the forward and backward host functions called directly (no autograd), each
kernel launch alone, the output allocations, the autograd engine's cost for a Python
autograd.Function (a Function whose forward and backward do no work), and SDPA's forward and
backward ops for comparison. The rows name the part; the numbers are microseconds per call.
Rows marked "JITFunction.run" turn off the launchers' direct launch of the compiled kernel
(lmscope.kernels.triton_launch.DirectLaunch), the same calls otherwise: its gain in one run.
"launches skipped" replaces the three launches by no-ops: what the Python and autograd around
them cost. "flash: forward+backward through autograd" is the public call, which takes the C++
host path (lmscope.kernels.flash_native) once the plan has been handed over; "Python Function"
rows, and the JITFunction.run and launches-skipped rows, run inside
``flash_attention.python_path()``.

Usage (GPU machine, repo root): PYTHONPATH=src python3 benchmarks/attention/host_breakdown.py
[--shape B,H,S,D] [--out rows.jsonl]
"""

from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F
from host_timing import append_parts, host_us, print_parts, shape_and_out  # beside this script

from lmscope.kernels import flash_attention as fa
from lmscope.kernels.flash_attention import native_path as fa_native


class _BackwardOnly(torch.autograd.Function):
    """A forward that does no work and flash's backward on a fixed (O, L): the backward's host
    cost when the autograd engine runs it, against calling it directly."""

    @staticmethod
    def forward(ctx, q, k, v, o, lse):
        ctx.save_for_backward(q, k, v, o, lse)
        return o.view_as(o)

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return (*fa.flash_attention_backward(do, q, k, v, o, lse, True), None, None)


def in_thread(fn) -> float:
    """host_us(fn) measured on a fresh Python thread instead of the main one."""
    result: list[float] = []
    worker = threading.Thread(target=lambda: result.append(host_us(fn)))
    worker.start()
    worker.join()
    return result[0]


class _Nothing(torch.autograd.Function):
    """The autograd engine's cost for a Python Function, with no work inside."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, do):
        return do, None, None


class _Skeleton(torch.autograd.Function):
    """Flash's Function without its Python or launches: the forward allocates O and L and saves
    what flash saves, the backward allocates dQ, dK, dV. Against "launches skipped", the share
    of lmscope's own host code."""

    @staticmethod
    def forward(ctx, q, k, v):
        o = torch.empty_like(q)
        ctx.save_for_backward(q, k, v, o, torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device))
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _single_threaded(fn) -> float:
    """host_us(fn) with the autograd engine running backward on the calling thread."""
    with torch.autograd.set_multithreading_enabled(False):
        return host_us(fn)


LAUNCHERS = ("_FWD_LAUNCH", "_DQ_LAUNCH", "_DKDV_LAUNCH")


@contextlib.contextmanager
def jit_launches():
    """Every launch through JITFunction.run, as before DirectLaunch (the Python Function)."""
    launchers = [getattr(fa, name).compiled for name in LAUNCHERS]
    saved = [launcher.supported for launcher in launchers]
    for launcher in launchers:
        launcher.supported = False
    try:
        with fa.python_path():
            yield
    finally:
        for launcher, flag in zip(launchers, saved, strict=True):
            launcher.supported = flag


@contextlib.contextmanager
def no_launches():
    """The three launchers replaced by no-ops (the host functions look them up per call; the
    Python Function)."""
    saved = {name: getattr(fa, name) for name in LAUNCHERS}
    for name in LAUNCHERS:
        setattr(fa, name, lambda *args: None)
    try:
        with fa.python_path():
            yield
    finally:
        for name, launcher in saved.items():
            setattr(fa, name, launcher)


def _under(context, fn) -> float:
    with context():
        return host_us(fn)


def parts(shape: tuple[int, int, int, int]) -> dict[str, float]:
    """Host microseconds per call of each part of a causal bf16 forward+backward at `shape`."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_out = torch.randn_like(q)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o, lse = fa.flash_attention_forward(qd, kd, vd, True)
    fa.flash_attention_backward(d_out, qd, kd, vd, o, lse, True)  # tunes once
    fwd_bwd = lambda: fa.flash_attention(q, k, v, causal=True).backward(d_out)  # noqa: E731
    for _ in range(fa_native._NATIVE_TRIES + 1):  # hands the plan to the C++ host path
        fwd_bwd()
    out = {
        "flash: forward+backward through autograd": host_us(fwd_bwd),
        "flash: forward+backward through autograd, Python Function": _under(fa.python_path, fwd_bwd),
        "flash: forward+backward through autograd, launches through JITFunction.run": _under(
            jit_launches, fwd_bwd),
        "flash: forward+backward through autograd, launches skipped": _under(no_launches, fwd_bwd),
        "flash: forward through autograd": host_us(lambda: fa.flash_attention(q, k, v, causal=True)),
        "flash: forward through autograd, Python Function": _under(
            fa.python_path, lambda: fa.flash_attention(q, k, v, causal=True)),
        "flash: flash_attention_forward direct": host_us(
            lambda: fa.flash_attention_forward(qd, kd, vd, True)),
        "flash: flash_attention_backward direct": host_us(
            lambda: fa.flash_attention_backward(d_out, qd, kd, vd, o, lse, True)),
        "flash: flash_attention_backward direct, on another Python thread": in_thread(
            lambda: fa.flash_attention_backward(d_out, qd, kd, vd, o, lse, True)),
        "autograd: flash backward alone (no-op forward)": host_us(
            lambda: _BackwardOnly.apply(q, k, v, o, lse).backward(d_out)),
        "autograd: flash backward alone, engine on the calling thread": _single_threaded(
            lambda: _BackwardOnly.apply(q, k, v, o, lse).backward(d_out)),
        "autograd: flash forward+backward, engine on the calling thread": _single_threaded(
            lambda: fa.flash_attention(q, k, v, causal=True).backward(d_out)),
        "autograd: empty Python Function forward+backward": host_us(
            lambda: _Nothing.apply(q, k, v).backward(d_out)),
        "autograd: Function saving and allocating what flash does, no other work": host_us(
            lambda: _Skeleton.apply(q, k, v).backward(d_out)),
        "torch.empty x4 (dQ, dK, dV, D)": host_us(
            lambda: [torch.empty(shape, dtype=q.dtype, device="cuda") for _ in range(4)]),
        "sdpa: forward+backward through autograd": host_us(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(d_out)),
        "sdpa: forward through autograd": host_us(
            lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    }
    for name in LAUNCHERS:
        launcher, calls = getattr(fa, name), []

        def record(*launch_args, _launcher=launcher, _calls=calls):
            _calls.append(launch_args)
            _launcher(*launch_args)

        setattr(fa, name, record)  # the host functions look the launcher up at call time
        try:
            fa.flash_attention_forward(qd, kd, vd, True)
            fa.flash_attention_backward(d_out, qd, kd, vd, o, lse, True)
        finally:
            setattr(fa, name, launcher)
        one = lambda launcher=launcher, a=calls[0]: launcher(*a)  # noqa: E731
        out[f"launch: {name} alone"] = host_us(one)
        out[f"launch: {name} alone, through JITFunction.run"] = _under(jit_launches, one)
    return out


def op_table(shape: tuple[int, int, int, int], calls: int = 50) -> str:
    """torch.profiler's CPU ops and CUDA kernels of `calls` eager flash forward+backward calls:
    which ops (copies, accumulations) the autograd path adds, and the host time each takes."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_out = torch.randn_like(q)
    for _ in range(5):
        fa.flash_attention(q, k, v, causal=True).backward(d_out)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fa.flash_attention(q, k, v, causal=True).backward(d_out)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)


def main() -> None:
    shape, out = shape_and_out(__doc__.splitlines()[0])
    measured = parts(shape)  # type: ignore[arg-type]
    direct = {name: getattr(fa, name).compiled.direct for name in LAUNCHERS}
    print(f"launches straight to the compiled kernel (DirectLaunch) during the run: {direct}")
    print_parts(shape, measured)
    print(f"\ntorch.profiler of 50 flash forward+backward calls at {shape}:\n")
    print(op_table(shape))  # type: ignore[arg-type]
    if out:
        append_parts(out, "attention-host-breakdown", shape, measured)


if __name__ == "__main__":
    main()
