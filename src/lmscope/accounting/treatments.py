"""What a `--checkpoint` policy does to each block: full recompute, selective recompute, offload.

A policy is one or more parts joined with `+`:

* `none` (alone): every block saves what its ops save;
* `block` | `every:K` | `blocks:LIST`: full checkpointing of all blocks, of blocks 0, K, 2K, ...,
  or of the listed ones (e.g. `blocks:0-3,7`): the block keeps its inputs and runs its forward
  again in the backward;
* `selective` | `selective:LIST`: selective recompute of all or the listed blocks: the block
  keeps the outputs of its matmuls and attention and rebuilds the elementwise work (norms,
  SwiGLU's activation, the heads' layout copy) in the backward;
* `offload` | `offload:LIST`: the block's saved activations go to host memory in the forward and
  come back in the backward (on a side stream, overlapped with compute); combines with either
  of the above on the same blocks (a fully checkpointed block then offloads its inputs).

A block both fully checkpointed and selective is refused: full recompute rebuilds everything
already. `plan:BUDGET` (alone) is resolved to a concrete policy by
`lmscope.accounting.checkpoint_plan`. Every policy string of the full-checkpointing grammar
keeps its meaning.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmscope.inputs.comma_list import list_items

NONE, FULL, SELECTIVE = "none", "full", "selective"
KINDS = (NONE, FULL, SELECTIVE)
"""What a block recomputes: nothing, its whole forward, or its elementwise work."""

PLAN_PREFIX = "plan:"
"""`plan:BUDGET`: the planner's policy under a memory budget (`lmscope.accounting.checkpoint_plan`)."""
_GRAMMAR = ("none, block, every:K (K >= 1, e.g. every:2), blocks:LIST (e.g. blocks:0-3,7), "
            "selective[:LIST], offload[:LIST], parts joined with + (e.g. blocks:0-9+selective:10-20) "
            "or plan:BUDGET (e.g. plan:40GiB)")


@dataclass(frozen=True)
class BlockTreatments:
    """Per treatment, the sorted indices of the blocks it applies to."""

    num_layers: int
    full: tuple[int, ...] = ()
    selective: tuple[int, ...] = ()
    offload: tuple[int, ...] = ()

    def kind(self, index: int) -> str:
        """none, full or selective for block `index`."""
        if index in self.full:
            return FULL
        return SELECTIVE if index in self.selective else NONE

    def offloaded(self, index: int) -> bool:
        return 0 <= index < self.num_layers and index in self.offload

    def per_block(self) -> list[tuple[str, bool]]:
        """(kind, offloaded) of every block in order."""
        return [(self.kind(i), i in self.offload) for i in range(self.num_layers)]

    @property
    def policy(self) -> str:
        """The canonical policy string (block lists as ranges)."""
        parts = []
        if self.full:
            whole = len(self.full) == self.num_layers
            parts.append("block" if whole else "blocks:" + format_blocks(self.full))
        for name, blocks in (("selective", self.selective), ("offload", self.offload)):
            if blocks:
                parts.append(name if len(blocks) == self.num_layers else f"{name}:{format_blocks(blocks)}")
        return "+".join(parts) or "none"


def check_policy_spelling(policy: str) -> None:
    """Refuse a --checkpoint value that is not written in the grammar, before the model (and so its
    number of blocks) is known; `plan:BUDGET` is left to the planner."""
    if not policy.startswith(PLAN_PREFIX):
        parse_treatments(policy, None)


def parse_treatments(policy: str, num_layers: int | None) -> BlockTreatments:
    """The blocks each treatment of `policy` applies to; ValueError (saying how to write one) else.

    num_layers None checks the spelling only: no block list is checked against the model's blocks.
    """
    full: set[int] = set()
    selective: set[int] = set()
    offload: set[int] = set()
    parts = [p.strip() for p in str(policy).split("+")]
    layers = num_layers or 0
    if policy == "none":
        return BlockTreatments(layers)
    for part in parts:
        prefix, colon, rest = part.partition(":")
        if part == "block":
            full.update(range(layers))
        elif prefix == "every" and rest.isdigit() and int(rest) >= 1:
            full.update(range(0, layers, int(rest)))
        elif prefix == "blocks" and rest:
            full.update(_block_list(part, rest, num_layers))
        elif prefix in ("selective", "offload") and (not colon or rest):
            chosen = _block_list(part, rest, num_layers) if colon else range(layers)
            (selective if prefix == "selective" else offload).update(chosen)
        else:
            raise ValueError(f"unknown checkpoint policy {policy!r}: use {_GRAMMAR}")
    both = sorted(full & selective)
    if both:
        raise ValueError(f"checkpoint policy {policy!r} makes blocks {format_blocks(both)} both fully "
                         "checkpointed and selective: full recompute rebuilds everything, drop one")
    return BlockTreatments(layers, tuple(sorted(full)), tuple(sorted(selective)), tuple(sorted(offload)))


def _block_list(part: str, text: str, num_layers: int | None) -> tuple[int, ...]:
    chosen: set[int] = set()
    for item in text.split(","):
        low, dash, high = item.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise ValueError(f"bad checkpoint policy {part}: give block indices and ranges, "
                             "e.g. blocks:0-3,7")
        first, last = int(low), int(high) if dash else int(low)
        if first > last or (num_layers is not None and last >= num_layers):
            raise ValueError(f"checkpoint policy {part} names blocks outside 0..{num_layers - 1}: "
                             "the model has that many blocks")
        chosen.update(range(first, last + 1))
    return tuple(sorted(chosen))


def checkpoint_values(text: str) -> list[str]:
    """The --checkpoint list: split on ';' when given, else on ',' unless it is one policy with a list."""
    if ";" not in text and any(f"{kind}:" in text for kind in ("blocks", "selective", "offload")):
        values = [text.strip()]  # one policy whose block lists hold commas
    else:
        values = list_items(text, "--checkpoint", ";" if ";" in text else ",")
    return list(dict.fromkeys(values))


def format_blocks(blocks: tuple[int, ...] | list[int]) -> str:
    """(0, 1, 2, 5, 7, 8) -> '0-2,5,7-8'."""
    runs: list[list[int]] = []
    for index in sorted(blocks):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
