"""The names of the data-parallel strategies `lmscope ddp` runs, read without importing torch.

The wrappers themselves live in `lmscope.parallel.ddp`, `.fsdp` and `.torch_fsdp2`; the command
line checks a --strategy value here first, so a typo is refused before torch is imported.
"""

from __future__ import annotations

import math

STRATEGIES = ("naive", "flat", "overlap", "bucketed:<MiB>", "coalesced:<MiB>", "torch-ddp[:<MiB>]",
              "fsdp[:separate-reduce]", "torch-fsdp2")
"""Names `parse_strategy` accepts; bucketed and coalesced take their bucket size, e.g. bucketed:25;
torch-ddp takes an optional bucket_cap_mb (PyTorch's default when left out); fsdp:separate-reduce
runs the reduce-scatters on a process group of their own (`FullyShardedDP(reduce_group=...)`).
The fully sharded ones (SHARDED) are built by `lmscope.parallel.fsdp` / `.torch_fsdp2`, not
`data_parallel`."""
SEPARATE_REDUCE = "fsdp:separate-reduce"
SHARDED = ("fsdp", "torch-fsdp2")
SIZED = ("bucketed", "coalesced", "torch-ddp")
NAMED = ("naive", "flat", "overlap", *SHARDED)
"""Strategies that take no bucket size."""
VARIANTS = {"fsdp": ("separate-reduce",)}
"""The named variants a strategy takes after a colon (`name:variant`, parsed as `name`)."""
BASELINE = "single"
"""The 1-GPU step every ddp sweep measures beside the strategies (one rank, no wrapper)."""


def parse_strategy(strategy: str) -> tuple[str, float | None]:
    """'bucketed:25' -> ('bucketed', 25.0); 'overlap', 'torch-ddp' (default cap) and
    'fsdp:separate-reduce' (the variant its row's strategy names) -> (name, None)."""
    name, colon, size = strategy.partition(":")
    if name in SIZED:
        if name == "torch-ddp" and not colon:
            return name, None
        try:
            bucket_mb = float(size)
        except ValueError:
            bucket_mb = -1.0
        if not (bucket_mb > 0 and math.isfinite(bucket_mb)):
            raise ValueError(f"strategy {strategy!r} needs a positive bucket size in MiB, e.g. {name}:25")
        return name, bucket_mb
    if name not in NAMED or (colon and size not in VARIANTS.get(name, ())):
        raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    return name, None


def check_strategy(strategy: str) -> None:
    """Refuse a --strategy value that is neither a strategy (`parse_strategy`) nor the baseline."""
    if strategy != BASELINE:
        parse_strategy(strategy)
