"""Does leaving SMs free for the side-stream optimizer speed up the in-backward xl step?

With `--optimizer-in-backward on`, FusedAdamW updates each weight on a side stream while the
backward's GEMMs run; run 14 hid only about 5 of the optimizer's 21 ms that way, because cuBLAS's
persistent GEMM kernels occupy every SM. cuBLASLt can be told to target fewer SMs
(CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, which torch sets from `torch._C._set_sm_carveout_experimental`
on its cuBLASLt path), leaving the rest to the memory-bound update. This script measures the fast
xl train step (lmscope's own `run_point`, CUDA graphs) for several carve-outs, each in a fresh
process, applied to the backward only (set while the backward is captured) or to every GEMM.

Usage (repo root, GPU machine): PYTHONPATH=src python3 benchmarks/fast/sm_carveout.py --out X.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from lmscope.records.results import stamp

CONFIGS: list[dict[str, Any]] = [
    {"blas": "default", "carveout": 0, "scope": "none", "optimizer_in_backward": False},
    {"blas": "default", "carveout": 0, "scope": "none", "optimizer_in_backward": True},
    {"blas": "cublaslt", "carveout": 0, "scope": "none", "optimizer_in_backward": True},
    *({"blas": "cublaslt", "carveout": n, "scope": "backward", "optimizer_in_backward": True}
      for n in (8, 16, 24, 32, 48)),
    {"blas": "cublaslt", "carveout": 16, "scope": "all", "optimizer_in_backward": True},
    {"blas": "cublaslt", "carveout": 16, "scope": "backward", "optimizer_in_backward": False},
]
KEPT = ("median_ms", "std_ms", "forward_ms", "backward_ms", "optimizer_ms", "peak_allocated_gib",
        "device_name")


def run_child(config: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One point with `config` applied in this process (fresh torch state)."""
    import torch

    from lmscope.workloads import step, train_step

    if config["blas"] != "default":
        torch.backends.cuda.preferred_blas_library(config["blas"])
    carveout = config["carveout"]
    if config["scope"] == "all":
        torch._C._set_sm_carveout_experimental(carveout)
    elif config["scope"] == "backward":
        backward = train_step.TrainStep._backward

        def carved_backward(self: train_step.TrainStep) -> None:
            torch._C._set_sm_carveout_experimental(carveout)
            try:
                backward(self)
            finally:
                torch._C._set_sm_carveout_experimental(None)

        train_step.TrainStep._backward = carved_backward
    point = {"size": args.size, "context_length": args.context_length, "batch_size": 4, "mode": "train-step",
             "precision": "bf16", "attention": "flash", "fast": True,
             "optimizer_in_backward": config["optimizer_in_backward"], "device": args.device,
             "warmup": 3, "steps": args.steps}
    return step.run_point(point)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", default="xl")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--context-length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=150.0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        metrics = run_child(json.loads(args.child), args)
        print("RESULT " + json.dumps({k: metrics.get(k) for k in KEPT}))
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for config in CONFIGS:
        row: dict[str, Any] = {"size": args.size, **config}
        try:
            command = [sys.executable, __file__, "--child", json.dumps(config), "--size", args.size,
                       "--device", args.device, "--context-length", str(args.context_length),
                       "--steps", str(args.steps), "--out", str(args.out)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
            found = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
            if found:
                row.update(status="ok", **json.loads(found[-1][len("RESULT "):]))
            else:
                row.update(status="error", error=(done.stderr or done.stdout)[-800:])
        except subprocess.TimeoutExpired:
            row.update(status="timeout")
        row = stamp(row, args.device)
        rows.append(row)
        with args.out.open("a") as out:
            out.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    print("\n| blas | carve-out SMs | scope | opt. in bwd | median ms | fwd ms | bwd ms | opt ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r.get(k) for k in ("median_ms", "forward_ms", "backward_ms", "optimizer_ms")]
        shown = " | ".join("-" if c is None else f"{c:.2f}" for c in cells)
        print(f"| {r['blas']} | {r['carveout']} | {r['scope']} | {r['optimizer_in_backward']} | {shown} |"
              if r["status"] == "ok" else f"| {r['blas']} | {r['carveout']} | {r['scope']} | "
              f"{r['optimizer_in_backward']} | {r['status'].upper()} | | | |")


if __name__ == "__main__":
    main()
