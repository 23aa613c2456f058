"""Does lmscope's timing of a user's step match a plain CUDA-event loop around the same step?

One process, one model, one step function: rounds alternate (their order flipping each round)
between `lmscope.probe.measure_step` and a plain loop that records a CUDA event pair around each
step and synchronizes once at its end (the host clock on a CPU). Every round writes one row per
method, and a final row holds the ratio of the pooled medians, plain / lmscope, with its bootstrap
interval over the rounds (`lmscope.records.stats.ratio_interval_rounds`: none below 3 rounds) and whether
it lies within --tolerance (the issue's
target: 2 %). The step is transformers' GPT-2 from its config (random weights, never a
download): forward with the LM loss under autocast, backward, AdamW (fused on CUDA).

    PYTHONPATH=src python3 benchmarks/own_model/fidelity.py --out $OUT/fidelity.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from pathlib import Path
from typing import Any

import torch

from lmscope.probe import measure_step
from lmscope.records.results import append_record, provenance
from lmscope.records.stats import ratio_interval_rounds
from lmscope.workloads.train_step import autocast_context


def build(args: argparse.Namespace, device: torch.device) -> tuple[Any, Any, torch.optim.Optimizer]:
    """GPT-2 from a config at the asked sizes, a random batch, and AdamW."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
                        vocab_size=args.vocab_size, n_positions=args.context_length)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).to(device)
    model.train()
    runnable = torch.compile(model) if args.compile else model
    batch = torch.randint(0, args.vocab_size, (args.batch_size, args.context_length), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    return runnable, batch, optimizer


def loss_fn(model: Any, batch: torch.Tensor) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss


def plain_loop(model: Any, batch: torch.Tensor, optimizer: torch.optim.Optimizer, *, warmup: int,
               steps: int, device: torch.device, precision: str) -> list[float]:
    """The reference: CUDA events around each step, one synchronize after the loop."""

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with autocast_context(precision, device):
            loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    if device.type != "cuda":
        times = []
        for _ in range(steps):
            begin = timeit.default_timer()
            step()
            times.append((timeit.default_timer() - begin) * 1e3)
        return times
    torch.cuda.synchronize(device)
    pairs = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize(device)
    return [start.elapsed_time(end) for start, end in pairs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="results JSONL (appended)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16", choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--context-length", type=int, default=1024)
    parser.add_argument("--n-embd", type=int, default=768)
    parser.add_argument("--n-layer", type=int, default=12)
    parser.add_argument("--n-head", type=int, default=12)
    parser.add_argument("--vocab-size", type=int, default=50257)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=0.02)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    model, batch, optimizer = build(args, device)
    tokens = args.batch_size * args.context_length
    point = {"workload": "own_model_fidelity", "model": "gpt2", "n_embd": args.n_embd,
             "n_layer": args.n_layer, "batch_size": args.batch_size, "context_length": args.context_length,
             "precision": args.precision, "compile": args.compile, "device": str(device)}
    times: dict[str, list[list[float]]] = {"lmscope": [], "cuda_events": []}
    for round_index in range(args.rounds):
        order = ("lmscope", "cuda_events") if round_index % 2 == 0 else ("cuda_events", "lmscope")
        for method in order:
            if method == "lmscope":
                row = measure_step(model, batch, loss_fn, optimizer, warmup=args.warmup, steps=args.steps,
                                   device=device, precision=args.precision, tokens_per_step=tokens,
                                   label="gpt2")
                measured = row["times_ms"]
            else:
                measured = plain_loop(model, batch, optimizer, warmup=args.warmup, steps=args.steps,
                                      device=device, precision=args.precision)
            times[method].append(measured)
            append_record(args.out, {**point, **provenance(), "status": "ok", "method": method,
                                     "round": round_index, "median_ms": statistics.median(measured),
                                     "times_ms": [round(t, 4) for t in measured]})
    interval = ratio_interval_rounds(times["cuda_events"], times["lmscope"])
    summary = {**point, **provenance(), "status": "ok", "method": "ratio",
               "plain_median_ms": statistics.median(sum(times["cuda_events"], [])),
               "lmscope_median_ms": statistics.median(sum(times["lmscope"], [])),
               "ratio_plain_over_lmscope": interval.ratio, "ratio_low": interval.low,
               "ratio_high": interval.high, "ratio_text": interval.as_text(3),
               "within_tolerance": abs(interval.ratio - 1) <= args.tolerance, "tolerance": args.tolerance}
    append_record(args.out, summary)
    print(f"plain {summary['plain_median_ms']:.2f} ms, lmscope {summary['lmscope_median_ms']:.2f} ms, "
          f"plain/lmscope {interval.as_text(3)}, within {args.tolerance:.0%}: {summary['within_tolerance']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
