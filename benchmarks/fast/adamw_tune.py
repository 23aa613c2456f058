"""FusedAdamW's block size and warps: the whole optimizer step of a model, replayed from a CUDA graph.

The update is memory bound (28 B per parameter with fp32 gradients), so how close it gets to the
device's copy bandwidth is the whole story. For each (BLOCK, num_warps) this captures one launch
of `lmscope.kernels.adamw._adamw_kernel` per parameter of the model (the shapes of
FastTransformerLM, built on the meta device), with fp32 gradients and bf16 shadow copies as the
fast path has them, replays the graph and reports the median time, the bandwidth and the ratio to
the memory floor at the copy bandwidth measured in the same process.

Usage (repo root, GPU machine): PYTHONPATH=src python3 benchmarks/fast/adamw_tune.py --size xl --out X.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import triton
from summarize import copy_bandwidth_gbps  # benchmarks/fast, this script's folder

from lmscope.config import preset
from lmscope.kernels import adamw
from lmscope.model.fast_transformer import FastTransformerLM
from lmscope.records.results import stamp

CONFIGS = [(2048, 8), (1024, 4), (2048, 4), (4096, 8), (4096, 16), (8192, 16), (1024, 8), (8192, 8)]
BYTES_PER_PARAM = 28 + 2  # AdamW with fp32 gradients, plus the bf16 shadow it writes


def median_ms(graph: torch.cuda.CUDAGraph, replays: int) -> float:
    """Median over `replays` of one graph replay, timed with CUDA events."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="xl")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with torch.device("meta"):
        shapes = [p.shape for p in FastTransformerLM(preset(args.size)).parameters()]
    params = [torch.randn(s, device="cuda") for s in shapes]
    grads = [torch.randn(s, device="cuda") * 1e-3 for s in shapes]
    moments = [(torch.zeros(s, device="cuda"), torch.zeros(s, device="cuda")) for s in shapes]
    shadows = [torch.empty(s, device="cuda", dtype=torch.bfloat16) for s in shapes]
    step = torch.ones((), device="cuda")
    count = sum(p.numel() for p in params)
    bandwidth = copy_bandwidth_gbps()
    floor_ms = count * 28 / (bandwidth * 1e9) * 1e3
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"{args.size}: {len(params)} parameters, {count:,} elements; copy {bandwidth:.0f} GB/s; "
          f"floor (28 B/param) {floor_ms:.2f} ms")
    print("| BLOCK | warps | ms | GB/s (30 B/param) | vs floor |\n|---|---|---|---|---|")
    for block, warps in CONFIGS:

        def launch_all(block: int = block, warps: int = warps) -> None:
            for p, g, (m, v), s in zip(params, grads, moments, shadows, strict=True):
                adamw._adamw_kernel[(triton.cdiv(p.numel(), block),)](
                    p, g, m, v, s, step, p.numel(), 1e-4, 0.9, 0.999, 1e-8, 0.01,
                    HAS_SHADOW=True, BLOCK=block, num_warps=warps,
                )  # fmt: skip

        launch_all()  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch_all()
        median_ms(graph, 3)
        ms = median_ms(graph, args.replays)
        row = {"size": args.size, "block": block, "num_warps": warps, "median_ms": ms,
               "gbps": count * BYTES_PER_PARAM / (ms * 1e-3) / 1e9, "floor_ms": floor_ms,
               "vs_floor": ms / floor_ms, "copy_gbps": bandwidth, "params": count}
        with args.out.open("a") as out:
            out.write(json.dumps(stamp(row)) + "\n")
        print(f"| {block} | {warps} | {ms:.2f} | {row['gbps']:.0f} | {row['vs_floor']:.3f}x |", flush=True)
        del graph


if __name__ == "__main__":
    main()
