"""Host time of FullyShardedDP's hooks: per hook call, and per unit of a whole step.

A model of many tiny blocks (lmscope's TransformerLM, d_model 16 by default, 48 layers) makes the
compute negligible, so a step's time is host time: the FSDP step less the same model's unwrapped
step is the wrapper's overhead, divided by the units it is the overhead per unit. Then every hook
(and the helpers they call, where the wrapper has them, and the collectives) is timed per call
with a wall clock around it: inclusive times (a hook's helpers and collectives count in it too),
as a mean over the calls of --steps steps. The collectives are gloo's on CPU: subtract them to
see the wrapper's own host time. With --cprofile N rank 0 also runs N steps under cProfile and
prints the functions with the most own time.

Forward and backward only (no optimizer), under bf16 autocast with `param_dtype=bfloat16` as
`lmscope ddp --precision bf16` runs it. On CPU (gloo) the CUDA-only work (side streams, events,
record_stream) does not run; --device cuda (nccl, one GPU per rank) times it too:

    uv run python benchmarks/distributed/fsdp_host_time.py                  # 1 gloo rank on CPU
    uv run python benchmarks/distributed/fsdp_host_time.py --nproc 2 --cprofile 5
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import functools
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lmscope.config import ModelConfig
from lmscope.measure.timer import synchronize
from lmscope.model.transformer import TransformerLM
from lmscope.parallel import fsdp
from lmscope.parallel.launch import RankContext, launch

HOOKS = ("_start_forward", "_pre_forward", "_post_forward", "_pre_backward", "_reduce_scatter", "_finish")
"""The wrapper's hooks (what autograd and the modules call)."""
HELPERS = {fsdp.FullyShardedDP: ("_issue", "_ready", "_free"),
           fsdp._FlatGroup: ("gather", "attach", "free", "detach_views"),
           dist: ("all_gather_into_tensor", "reduce_scatter_tensor")}
"""Helpers the hooks call, timed where the classes still have them; and the collectives (with
torch.distributed's Python layer), whose time the hooks' include."""


def _step(model: torch.nn.Module, tokens: torch.Tensor) -> None:
    """Forward and backward of one batch under bf16 autocast."""
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16):
        logits = model(tokens)
    F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten(), reduction="mean").backward()


def _steps_ms(steps: list[Callable[[], None]], device: torch.device, warmup: int, count: int) -> list[float]:
    """Median wall time (ms) of each of `steps` over `count` rounds that call each once in turn
    (so that a slow spell of the machine hits both alike), after `warmup` such rounds."""
    times: list[list[float]] = [[] for _ in steps]
    for round_ in range(warmup + count):
        for step, kept in zip(steps, times, strict=True):
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            if round_ >= warmup:
                kept.append((time.perf_counter() - start) * 1e3)
    return [statistics.median(kept) for kept in times]


def _timed_methods(totals: dict[str, list[float]]) -> Callable[[], None]:
    """Wrap the hooks and helpers (on their classes or module) with wall clocks adding to `totals`
    (name -> [calls, seconds]); returns the function that puts the originals back."""
    originals = []
    for cls, names in [(fsdp.FullyShardedDP, HOOKS), *HELPERS.items()]:
        for name in names:
            if name not in vars(cls):
                continue
            original = vars(cls)[name]
            label = f"{getattr(cls, '__name__', cls)}.{name}"

            def timed(*args: Any, _original: Callable[..., Any] = original, _label: str = label,
                      **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    entry = totals[_label]
                    entry[0] += 1
                    entry[1] += time.perf_counter() - start

            setattr(cls, name, functools.wraps(original)(timed))
            originals.append((cls, name, original))

    def restore() -> None:
        for cls, name, original in originals:
            setattr(cls, name, original)

    return restore


def measure(ctx: RankContext, args: dict[str, Any]) -> dict[str, Any]:
    """On every rank: the unwrapped step, the FSDP step, the hooks per call; rank 0's numbers."""
    config = ModelConfig(vocab_size=args["vocab_size"], context_length=args["seq"], d_model=args["d_model"],
                         d_ff=2 * args["d_model"], num_layers=args["num_layers"], num_heads=1)
    torch.manual_seed(0)
    model = TransformerLM(config).to(ctx.device)
    tokens = torch.randint(0, config.vocab_size, (args["batch_size"], args["seq"]), device=ctx.device)
    plain = copy.deepcopy(model)
    wrapped = fsdp.FullyShardedDP(model, param_dtype=torch.bfloat16)

    def step() -> None:
        wrapped.zero_grad(set_to_none=True)
        _step(wrapped, tokens)

    def plain_step() -> None:
        plain.zero_grad(set_to_none=True)
        _step(plain, tokens)

    steps = args["steps"]
    plain_ms, fsdp_ms = _steps_ms([plain_step, step], ctx.device, args["warmup"], steps)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    restore = _timed_methods(totals)
    try:
        for _ in range(steps):
            step()
        synchronize(ctx.device)
    finally:
        restore()
    if args["cprofile"] and ctx.rank == 0:
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [step() for _ in range(args["cprofile"])])
        pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
    elif args["cprofile"]:
        for _ in range(args["cprofile"]):
            step()
    units = len(wrapped.units) + (wrapped.root is not None)
    hooks = {name: (calls / steps, seconds / calls * 1e6) for name, (calls, seconds) in totals.items()}
    return {"units": units, "plain_ms": plain_ms, "fsdp_ms": fsdp_ms, "hooks": hooks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--num-layers", type=int, default=48)
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=64)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cprofile", type=int, default=0, metavar="N", help="steps to run under cProfile")
    args = parser.parse_args()
    backend = "gloo" if args.device == "cpu" else "nccl"
    result = launch(measure, vars(args), nproc=args.nproc, backend=backend)
    units, plain, wrapped = result["units"], result["plain_ms"], result["fsdp_ms"]
    print(f"{args.device}, {args.nproc} rank(s), {units} units: unwrapped step {plain:.2f} ms, "
          f"FSDP step {wrapped:.2f} ms, overhead {(wrapped - plain) * 1e3 / units:.0f} us per unit")
    print(f"{'hook / helper':40} {'calls/step':>10} {'us/call':>9}")
    for name, (calls, us) in sorted(result["hooks"].items()):
        print(f"{name:40} {calls:10.1f} {us:9.1f}")


if __name__ == "__main__":
    main()
