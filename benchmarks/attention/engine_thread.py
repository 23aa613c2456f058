"""Where the autograd engine's device thread spends an eager FlashAttention backward's host time.

host_breakdown.py showed that flash's forward+backward through autograd costs about as much
host time as SDPA's when the engine runs the backward on the calling thread
(`torch.autograd.set_multithreading_enabled(False)`), and about twice as much when it runs on
the engine's CUDA device thread (the default). This script asks why, at one shape, for SDPA,
flash and a Function skeleton (flash's saves and allocations, no work), each with the device
thread and without:

- the host microseconds per forward+backward (host_timing.host_us);
- the same with Python's thread switch interval at 1 us (is the device thread waiting for the
  GIL?) and with the garbage collector off;
- the backward split by Python hooks that stamp the time: from `backward()` to the first hook on
  the device thread (the hand-off), from there to the last gradient accumulated (the backward's
  own work), and from there until `backward()` returns (the hand-back); the hooks cost the same
  for every implementation.

Usage (GPU machine, repo root): PYTHONPATH=src python3 benchmarks/attention/engine_thread.py
[--shape B,H,S,D] [--out rows.jsonl]
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from host_breakdown import _Skeleton  # beside this script
from host_timing import append_parts, host_us, print_parts, shape_and_out

from lmscope.kernels import flash_attention as fa

STAMPED_CALLS = 300


@contextlib.contextmanager
def device_thread(enabled: bool) -> Iterator[None]:
    """The engine's device thread on (the default) or off (backward on the calling thread)."""
    with torch.autograd.set_multithreading_enabled(enabled):
        yield


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    saved = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(saved)


@contextlib.contextmanager
def gc_off() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def stamped_split(forward: Callable[[], torch.Tensor], leaves: tuple[torch.Tensor, ...],
                  d_out: torch.Tensor) -> dict[str, float]:
    """Median microseconds of hand-off, work and hand-back of `STAMPED_CALLS` backwards."""
    stamps: list[float] = []

    def first(grad: torch.Tensor) -> None:
        stamps.append(time.perf_counter())

    def accumulated(_: torch.Tensor) -> None:
        stamps.append(time.perf_counter())

    handles = [leaf.register_post_accumulate_grad_hook(accumulated) for leaf in leaves]
    split: dict[str, list[float]] = {"hand-off": [], "work": [], "hand-back": []}
    try:
        for index in range(STAMPED_CALLS + 10):
            torch.cuda.synchronize()  # no queue of earlier launches for this backward to wait on
            out = forward()
            out.register_hook(first)
            stamps.clear()
            start = time.perf_counter()
            out.backward(d_out)
            end = time.perf_counter()
            if index >= 10:
                split["hand-off"].append(stamps[0] - start)
                split["work"].append(max(stamps[1:]) - stamps[0])
                split["hand-back"].append(end - max(stamps[1:]))
    finally:
        for handle in handles:
            handle.remove()
    torch.cuda.synchronize()
    return {part: statistics.median(times) * 1e6 for part, times in split.items()}


def parts(shape: tuple[int, int, int, int]) -> dict[str, float]:
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_out = torch.randn_like(q)
    forwards = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "flash": lambda: fa.flash_attention(q, k, v, causal=True),
        "skeleton": lambda: _Skeleton.apply(q, k, v),
    }
    out: dict[str, float] = {}
    for thread in (True, False):
        where = "device thread" if thread else "calling thread"
        for name, forward in forwards.items():
            step = lambda forward=forward: forward().backward(d_out)  # noqa: E731
            with device_thread(thread):
                out[f"{name}: forward+backward, {where}"] = host_us(step)
                if name != "skeleton":
                    with switch_interval(1e-6):
                        out[f"{name}: forward+backward, {where}, switch interval 1 us"] = host_us(step)
                    with gc_off():
                        out[f"{name}: forward+backward, {where}, gc off"] = host_us(step)
                for part, us in stamped_split(forward, (q, k, v), d_out).items():
                    out[f"{name}: backward {part}, {where}"] = us
    return out


def main() -> None:
    shape, out = shape_and_out(__doc__.splitlines()[0])
    measured = parts(shape)  # type: ignore[arg-type]
    print_parts(shape, measured)
    if out:
        append_parts(out, "attention-engine-thread", shape, measured)


if __name__ == "__main__":
    main()
