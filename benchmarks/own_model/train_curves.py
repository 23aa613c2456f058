"""Does a transformers model trained through lmscope's fast path follow the unpatched model's loss?

Two runs from the same random weights on the same fixed synthetic token stream: transformers' own
model (SDPA attention, torch's AdamW) and the same model after `lmscope.model.hf_fast.
apply_to_hf_model` (lmscope's kernels, FusedAdamW with its bf16 weight copies), both under bf16
autocast with the loss of ``labels`` (shifted by one inside the model). The stream is a fixed
random walk on a small set of tokens, each followed by one of a few successors, so the loss has
somewhere to go: from log(vocab) down towards log(successors). Both runs follow the usual LLM
recipe, a linear learning-rate warmup and the gradients' global norm clipped (--warmup-steps,
--clip-grad-norm), so that a loss spike does not decide the comparison: without them the two runs
met one spike at the same step but of different heights (benchmarks/results/own_model/curves/).
Writes one row per run (its per-step losses) and one row comparing them to OUT/curves.jsonl, and
OUT/curves.png (both curves and their difference).

    PYTHONPATH=src python3 benchmarks/own_model/train_curves.py --out-dir $OUT
    # on the CPU, tiny (the kernels in Triton's interpreter):
    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/own_model/train_curves.py --out-dir /tmp/curves \
        --device cpu --attention flash-torch --num-layers 1 --batch-size 2 --context-length 32 --steps 5 \
        --model hf:path/to/tiny-config.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from lmscope.records.results import append_record, provenance
from lmscope.sources.hf import hf_config
from lmscope.sources.request import ModelRequest
from lmscope.workloads.train_step import autocast_context


def token_stream(steps: int, batch: int, context: int, vocab: int, *, active: int, successors: int,
                 seed: int) -> torch.Tensor:  # fmt: skip
    """(steps, batch, context + 1) token ids: random walks over `active` tokens of the vocabulary,
    each token followed by one of its `successors` fixed ones, uniformly."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randperm(vocab, generator=generator)[:active]
    table = torch.randint(0, active, (active, successors), generator=generator)
    state = torch.randint(0, active, (steps * batch,), generator=generator)
    walk = [state]
    for _ in range(context):
        choice = torch.randint(0, successors, state.shape, generator=generator)
        state = table[state, choice]
        walk.append(state)
    return tokens[torch.stack(walk, dim=-1)].view(steps, batch, context + 1)


def build(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    """The transformers causal LM of --model at the asked sizes, seeded: the same weights every call."""
    import transformers

    request = ModelRequest(name=args.model, num_layers=args.num_layers, context_length=args.context_length,
                           attention="sdpa")
    config = hf_config(request)
    torch.manual_seed(args.seed)
    with device:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.float().train()


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, stream: torch.Tensor,
          args: argparse.Namespace, progress: Progress, label: str) -> list[float]:  # fmt: skip
    """One optimizer step per batch of the stream, after a linear warmup of the learning rate and
    with the gradients' global norm clipped (when --clip-grad-norm > 0); the losses."""
    device = torch.device(args.device)
    ramp = max(1, args.warmup_steps)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / ramp))
    losses = []
    task = progress.add_task(label, total=len(stream))
    for batch in stream:
        tokens = batch.to(device)
        optimizer.zero_grad(set_to_none=True)
        with autocast_context(args.precision, device):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        if args.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        optimizer.step()
        warmup.step()
        losses.append(loss.item())
        progress.advance(task)
    return losses


def run(args: argparse.Namespace, patched: bool, stream: torch.Tensor, progress: Progress) -> list[float]:
    device = torch.device(args.device)
    model = build(args, device)
    if patched:
        from lmscope.model.hf_fast import apply_to_hf_model

        patch = apply_to_hf_model(model, attention=args.attention)
        shadow = torch.bfloat16 if args.precision == "bf16" else None
        optimizer = patch.fused_adamw(lr=args.lr, shadow_dtype=shadow, weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay,
                                      fused=device.type == "cuda")
    label = "lmscope fast" if patched else "transformers"
    return train(model, optimizer, stream, args, progress, label)


def plot(curves: dict[str, list[float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=(3, 1))
    for label, losses in curves.items():
        top.plot(range(1, len(losses) + 1), losses, label=label, lw=1.2)
    top.set_ylabel("training loss")
    top.set_title(title, fontsize=9)
    top.legend()
    top.grid(alpha=0.3)
    first, second = curves.values()
    bottom.plot(range(1, len(first) + 1), [b - a for a, b in zip(first, second, strict=True)], lw=1.0)
    bottom.axhline(0.0, color="gray", lw=0.8)
    bottom.set_ylabel("fast - transformers")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def compare(curves: dict[str, list[float]], tail: int) -> dict[str, Any]:
    """The two runs side by side: mean loss over the last `tail` steps, largest difference."""
    ours, theirs = curves["lmscope fast"], curves["transformers"]
    tail = max(1, min(tail, len(ours)))
    return {"tail_steps": tail, "tail_mean_fast": statistics.fmean(ours[-tail:]),
            "tail_mean_transformers": statistics.fmean(theirs[-tail:]),
            "max_abs_difference": max(abs(a - b) for a, b in zip(ours, theirs, strict=True)),
            "first_loss": theirs[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--model", default="hf:examples/llama-3.2-1b-shape.json")
    parser.add_argument("--num-layers", type=int, default=None, help="override the config's layers")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--context-length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--warmup-steps", type=int, default=30, help="linear learning-rate warmup")
    parser.add_argument("--clip-grad-norm", type=float, default=1.0, help="0: no clipping")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--attention", default="flash", choices=("flash", "flash-torch"))
    parser.add_argument("--active-tokens", type=int, default=1024, help="tokens the stream walks over")
    parser.add_argument("--successors", type=int, default=4, help="successors of each token")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    vocab = hf_config(ModelRequest(name=args.model, attention="sdpa")).vocab_size
    stream = token_stream(args.steps, args.batch_size, args.context_length - 1, vocab, seed=args.seed + 1,
                          active=min(args.active_tokens, vocab), successors=args.successors)
    point = {"workload": "own_model_train_curves", "model": args.model, "num_layers": args.num_layers,
             "batch_size": args.batch_size, "context_length": args.context_length, "steps": args.steps,
             "lr": args.lr, "warmup_steps": args.warmup_steps, "clip_grad_norm": args.clip_grad_norm,
             "precision": args.precision, "attention": args.attention, "device": args.device,
             "active_tokens": args.active_tokens, "successors": args.successors, "seed": args.seed}
    curves: dict[str, list[float]] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeRemainingColumn())
    with Progress(*columns) as progress:
        for patched in (False, True):
            label = "lmscope fast" if patched else "transformers"
            curves[label] = run(args, patched, stream, progress)
            append_record(args.out_dir / "curves.jsonl",
                          {**point, **provenance(), "status": "ok", "run": label, "losses": curves[label]})
    summary = compare(curves, tail=max(1, args.steps // 10))
    append_record(args.out_dir / "curves.jsonl",
                  {**point, **provenance(), "status": "ok", "run": "comparison", **summary})
    title = (f"{args.model.removeprefix('hf:')}, batch {args.batch_size} x {args.context_length}, "
             f"{args.precision}, lr {args.lr}, warmup {args.warmup_steps}, clip {args.clip_grad_norm}")
    plot(curves, args.out_dir / "curves.png", title)
    print(f"last {summary['tail_steps']} steps: transformers {summary['tail_mean_transformers']:.4f}, "
          f"lmscope fast {summary['tail_mean_fast']:.4f}; largest step difference "
          f"{summary['max_abs_difference']:.4f} (first loss {summary['first_loss']:.4f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
