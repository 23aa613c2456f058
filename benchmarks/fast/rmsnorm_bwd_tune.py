"""RMSNorm's backward (the fast path's add_rmsnorm) per launch layout, replayed from a CUDA graph.

The backward of `add_rmsnorm` reads s (fp32), dy (bf16) and the residual gradient (fp32) and
writes dx (fp32) and d(delta) (bf16) for every row, then sums the per-program partials of dweight.
For each (PROGRAMS_PER_SM, MAX_TILE) of `lmscope.kernels.rmsnorm` this captures 20 backward calls
at the shape of one fast-path norm (batch 4 x context 512 rows) in a CUDA graph, replays it and
reports the median time per call and the bandwidth those bytes imply. MAX_TILE equal to the padded
width is one row per step of a program's loop.

Usage (repo root, GPU machine): PYTHONPATH=src python3 benchmarks/fast/rmsnorm_bwd_tune.py --out X.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from lmscope.config import preset
from lmscope.kernels import rmsnorm
from lmscope.results import provenance

CALLS = 20


def time_layout(s: torch.Tensor, dy: torch.Tensor, ds: torch.Tensor, weight: torch.Tensor,
                rstd: torch.Tensor) -> float:
    """Median us per backward call, from replays of CALLS captured calls."""
    def calls() -> None:
        for _ in range(CALLS):
            rmsnorm._launch_backward(dy, s, weight, rstd, ds, torch.bfloat16)

    calls()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    return triton.testing.do_bench(graph.replay, warmup=25, rep=200) * 1e3 / CALLS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="small,xl,2.7B")
    parser.add_argument("--rows", type=int, default=4 * 512)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    meta = {k: v for k, v in provenance().items() if k in ("device_name", "torch", "triton", "git_sha")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print("| size | width | programs/SM | max tile | rows/step | us | GB/s |\n|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        d = preset(size).d_model
        block = triton.next_power_of_2(d)
        s = torch.randn(args.rows, d, device="cuda")
        dy = torch.randn(args.rows, d, device="cuda", dtype=torch.bfloat16)
        ds = torch.randn(args.rows, d, device="cuda")
        weight = torch.randn(d, device="cuda")
        rstd = torch.rand(args.rows, device="cuda") + 0.5
        moved = args.rows * d * (4 + 2 + 4 + 4 + 2)  # s, dy, ds read; dx, d(delta) written
        for per_sm in (2, 4, 8):
            for tile in sorted({block, 2 * block, 4 * block, 8192, 16384}):
                if tile < block:
                    continue
                rmsnorm.PROGRAMS_PER_SM, rmsnorm.MAX_TILE = per_sm, tile
                rows_per_program = triton.cdiv(args.rows, rmsnorm._programs(args.rows, s.device))
                step_rows = rmsnorm._rows_per_step(rows_per_program, block)
                us = time_layout(s, dy, ds, weight, rstd)
                row = {"size": size, "width": d, "rows": args.rows, "programs_per_sm": per_sm,
                       "max_tile": tile, "rows_per_step": step_rows, "us": us,
                       "gbps": moved / (us * 1e-6) / 1e9, **meta}
                with args.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")
                print(f"| {size} | {d} | {per_sm} | {tile} | {step_rows} | {us:.1f} | {row['gbps']:.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
