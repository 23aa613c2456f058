"""Where the time of the fast train step goes: a torch.profiler kernel table (GPU, markdown).

Used by run_gpu.sh when `lmscope profile` has no --fast flag. Builds the bench point
(bf16, batch 4, context 512, --fast on, flash attention), warms up, profiles a few steps and
prints the kernels by total GPU time with their share, count and mean, plus the phase times.
Usage: PYTHONPATH=src python3 benchmarks/fast/kernel_table.py --size xl [--steps 3] [--top 30]
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from lmscope.measure.timer import PhaseClock, synchronize
from lmscope.workloads.step import Spec
from lmscope.workloads.train_step import TrainStep


def kernel_times(prof: profile) -> dict[str, list[float]]:
    """GPU kernel name -> durations in microseconds, from the profiler's device events."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name].append(event.time_range.elapsed_us())
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="xl")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    spec = Spec(size=args.size, context_length=512, batch_size=4, precision="bf16", mode="train-step",
                attention="flash", fast=True, device="cuda")
    step = TrainStep(spec)
    clock = PhaseClock(step.device)
    for _ in range(3):
        step(clock)
        synchronize(step.device)
    phases = clock.elapsed_ms()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        synchronize(step.device)
    times = kernel_times(prof)
    total = sum(sum(v) for v in times.values())
    print(f"# Kernels of the fast {args.size} train step (bf16, batch 4, context 512)\n")
    print("phases of the last warm-up step (ms): "
          + ", ".join(f"{name} {ms:.2f}" for name, ms in phases.items()))
    print(f"\nGPU kernel time per step: {total / args.steps / 1e3:.2f} ms over "
          f"{sum(len(v) for v in times.values()) // args.steps} launches\n")
    print("| kernel | share | ms/step | launches/step | mean us |")
    print("|---|---|---|---|---|")
    ranked = sorted(times.items(), key=lambda kv: -sum(kv[1]))
    for name, durations in ranked[: args.top]:
        spent = sum(durations)
        print(f"| {name[:90]} | {spent / total:.1%} | {spent / args.steps / 1e3:.3f} | "
              f"{len(durations) // args.steps} | {spent / len(durations):.1f} |")


if __name__ == "__main__":
    main()
