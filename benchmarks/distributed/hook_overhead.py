"""Host cost per step of the data-parallel wrappers' gradient hooks, on CPU.

The model is the Transformer LM with xl's parameter count per tensor kind (48 layers: 435
parameter tensors) but tiny widths, so that backward computes almost nothing and what the
wrappers add to it is mostly Python: the hooks, the copies into buckets, the calls. Each
strategy runs `--steps` steps (zero_grad(set_to_none=True), forward, backward,
finish_gradient_synchronization) on `--nproc` gloo ranks; the table gives the median
backward + finish time per step, the same for the unwrapped model, and the difference per
parameter tensor.

    uv run python benchmarks/distributed/hook_overhead.py --nproc 1 [--out X.jsonl]

With --out, one row per strategy is appended, with lmscope's provenance.
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lmscope.config import ModelConfig
from lmscope.model.transformer import TransformerLM
from lmscope.parallel.ddp import data_parallel
from lmscope.parallel.launch import RankContext, launch
from lmscope.records.results import append_record, stamp

CONFIG = ModelConfig(vocab_size=37, context_length=8, d_model=16, d_ff=32, num_layers=48, num_heads=2)


def _time(ctx: RankContext, strategy: str | None, steps: int) -> tuple[float, int]:
    torch.manual_seed(0)
    model = TransformerLM(CONFIG)
    wrapped = model if strategy is None else data_parallel(strategy, model)
    finish = getattr(wrapped, "finish_gradient_synchronization", lambda: None)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, CONFIG.context_length))
    times = []
    for step in range(steps + 5):
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(wrapped(tokens).flatten(0, 1), tokens.flatten())
        begin = timeit.default_timer()
        loss.backward()
        finish()
        if step >= 5:
            times.append(timeit.default_timer() - begin)
    return statistics.median(times) * 1e3, sum(1 for p in model.parameters() if p.requires_grad)


def _all(ctx: RankContext, strategies: list[str], steps: int) -> list[tuple[str, float, float, int]]:
    torch.set_num_threads(1)
    plain_ms, count = _time(ctx, None, steps)
    rows = [("unwrapped", plain_ms, 0.0, count)]
    for strategy in strategies:
        dist.barrier()
        ms, _ = _time(ctx, strategy, steps)
        rows.append((strategy, ms, (ms - plain_ms) * 1e3 / count, count))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--strategy", default="naive,flat,overlap,bucketed:1000,bucketed:0.001,torch-ddp")
    parser.add_argument("--out", type=Path, default=None, help="append the rows to this JSONL")
    args = parser.parse_args()
    rows = launch(_all, args.strategy.split(","), args.steps, nproc=args.nproc, backend="gloo",
                  timeout_s=600)
    print(f"{rows[0][3]} parameter tensors, {args.nproc} gloo rank(s), median of {args.steps} steps")
    print(f"{'strategy':16s} {'backward+finish ms':>20s} {'added us/param':>15s}")
    for name, ms, per_param_us, count in rows:
        print(f"{name:16s} {ms:20.2f} {per_param_us:15.1f}")
        if args.out:
            append_record(args.out, stamp({
                "strategy": name, "nproc": args.nproc, "steps": args.steps, "parameter_tensors": count,
                "backward_finish_ms": ms, "added_us_per_param": per_param_us}, device="cpu"))


if __name__ == "__main__":
    main()
