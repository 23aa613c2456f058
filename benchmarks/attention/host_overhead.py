"""Host (CPU) cost per call of the attention implementations at a small shape, and where it goes.

At small shapes the GPU finishes an attention call in microseconds, so what a call costs is the
host's work to launch it. This script measures that work: the wall time of many calls issued
without synchronizing while a sleep kernel holds the GPU (host_timing.py: the host is then the
only thing timed; the median of its rounds), per implementation, and a cProfile of flash-triton's
forward+backward to name the Python functions that spend it.

flash-triton launches its autotuned kernels through ``triton.autotune`` only until the autotuner
has chosen a config for the key, then calls the JIT function directly (``_Launcher`` in
lmscope/kernels/flash_attention/launcher.py); the row "flash-triton via autotuner" turns that off in the
same process, and the second table times one forward-kernel launch both ways.

A third column gives the GPU time of the same call: the CUDA kernels' durations in a
torch.profiler trace of 50 calls, summed per call. Host time above GPU time is what the host
adds to an eager call; do_bench at such a shape measures roughly the larger of the two.

Usage (GPU machine, repo root): PYTHONPATH=src python3 benchmarks/attention/host_overhead.py
[--shape B,H,S,D] (default 8,1,256,64: the classic grid's smallest point; xl's layer is 4,25,512,64)
[--out X.jsonl] (appends one row per measurement, with lmscope's provenance)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from host_timing import CALLS, ROUNDS, host_us  # beside this script

from lmscope.kernels import flash_attention as fa
from lmscope.kernels.flash_attention import launcher as fa_launcher
from lmscope.kernels.flash_attention import plan as fa_plan
from lmscope.kernels.flash_attention import triton_kernels as fa_kernels
from lmscope.kernels.triton_launch import FixedArgs
from lmscope.records.results import append_record, stamp

LAUNCHERS = (fa_launcher._FWD_LAUNCH, fa_launcher._DKDV_LAUNCH, fa_launcher._DQ_LAUNCH)



@contextmanager
def _via_autotuner():
    """Every launch through triton.autotune's Autotuner.run, as before the direct path."""
    saved = [launcher.run for launcher in LAUNCHERS]
    for launcher in LAUNCHERS:
        launcher.run = None
        launcher.known.clear()
    try:
        yield
    finally:
        for launcher, run in zip(LAUNCHERS, saved, strict=True):
            launcher.run = run


def _one_forward_launch(q, k, v) -> dict[str, float]:
    """Host us of one _attn_fwd launch: through the autotuner vs the JIT function directly."""
    n, d = q.shape[-2], q.shape[-1]
    bh, h = q.shape[0] * q.shape[1], q.shape[1]
    o, lse = torch.empty_like(q), torch.empty(q.shape[:-1], device=q.device)
    bucket = fa_plan._bucket(n)
    key = (d, True, q.dtype, bucket, bucket, False, False)
    tensors = (q, k, v, o, lse)
    fixed = FixedArgs((*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                       h, n, n, 1.0 / math.sqrt(d) * fa_plan.LOG2E, bucket, bucket))  # fmt: skip
    args = (*tensors, *fixed.args)
    consts = {"HEAD_DIM": d, "D_PAD": d, "DOT_PREC": "tf32", "CAUSAL": True}

    def grid(meta):
        tiles = triton.cdiv(n, meta["BLOCK_M"])
        return (bh, tiles) if meta["HEAD_MAJOR"] else (tiles, bh)

    fa_launcher._FWD_LAUNCH(key, n, bh, tensors, fixed)  # tunes (if needed) and remembers the choice
    return {
        "autotuner: _attn_fwd[grid](...)": host_us(lambda: fa_kernels._attn_fwd[grid](*args, **consts)),
        "direct: _FWD_LAUNCH(...) -> fn.run": host_us(
            lambda: fa_launcher._FWD_LAUNCH(key, n, bh, tensors, fixed)),
        "torch.empty (one output)": host_us(lambda: torch.empty_like(q)),
    }


def _gpu_us(fn, calls: int = 50) -> float:
    """GPU time per call: the CUDA kernels' durations in a profiler trace, summed, over `calls`."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in kernels) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8,1,256,64", help="batch,heads,seq,head_dim")
    parser.add_argument("--out", type=Path, default=None, help="append the rows to this JSONL")
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_out = torch.randn_like(q)

    def flash():
        return fa.flash_attention(q, k, v, causal=True)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    rows = []
    for name, fwd in (("flash-triton", flash), ("sdpa", sdpa)):
        rows.append((name, host_us(lambda fwd=fwd: fwd().detach()),
                     host_us(lambda fwd=fwd: fwd().backward(d_out)),
                     _gpu_us(lambda fwd=fwd: fwd().backward(d_out))))  # fmt: skip
    with _via_autotuner():
        rows.append(("flash-triton via autotuner", host_us(lambda: flash().detach()),
                     host_us(lambda: flash().backward(d_out)), float("nan")))  # fmt: skip
    print(f"shape (B, H, S, d) = {shape}, bf16, causal")
    print("| impl | fwd host us/call | fwd+bwd host us/call | fwd+bwd GPU us/call |")
    print("|---|---|---|---|")
    for name, fwd_us, both_us, gpu_us in rows:
        print(f"| {name} | {fwd_us:.1f} | {both_us:.1f} | {gpu_us:.1f} |")
        if args.out:
            append_record(args.out, stamp({"table": "host_per_call", "shape": list(shape), "impl": name,
                                           "fwd_host_us": fwd_us, "fwd_bwd_host_us": both_us,
                                           "fwd_bwd_gpu_us": gpu_us, "calls": CALLS, "rounds": ROUNDS}))

    with torch.no_grad():
        launch = _one_forward_launch(q.detach(), k.detach(), v.detach())
    print("\n| one launch | host us |")
    print("|---|---|")
    for name, us in launch.items():
        print(f"| {name} | {us:.1f} |")
        if args.out:
            append_record(args.out, stamp({"table": "one_launch", "shape": list(shape), "launch": name,
                                           "host_us": us, "calls": CALLS, "rounds": ROUNDS}))

    outs = [flash() for _ in range(100)]
    profiler = cProfile.Profile()
    profiler.enable()
    for out in outs:  # the backward alone: the forward's host cost is the table's first column
        out.backward(d_out)
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    print("\ncProfile of 100 flash-triton backward calls, by own time:\n")
    print(text.getvalue())


if __name__ == "__main__":
    main()
