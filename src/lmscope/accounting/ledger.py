"""The running total of allocated bytes that the memory models replay, and segments of it.

A `Ledger` follows what PyTorch's caching allocator sees, op by op: allocations, frees, what autograd
keeps for backward (by kind), autocast's cached weight copies, and bytes moved to host memory. A
`Segment` is the record of one stretch of such operations (one block's forward, say): its net change,
its highest rise above the start, the cache it leaves and what it keeps. Applying a segment to a
ledger gives exactly the level and peak that replaying its operations would, so a step of many
identical blocks is replayed once per kind of block and composed, which is what lets the
checkpoint planner price thousands of per-block plans.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Segment:
    """What a stretch of ledger operations does, wherever it starts."""

    delta: int
    """Net change of the level."""
    rise: int
    """Highest level above the start (>= 0)."""
    cache: int
    """Autocast weight copies it leaves in the cache."""
    kept: tuple[tuple[str, int], ...]
    """Bytes it adopts as kept for backward, by kind (negative: released, e.g. moved to host)."""
    host: int
    """Bytes it moves to host memory (negative: brought back)."""

    def kept_bytes(self, leave_out: tuple[str, ...] = ()) -> int:
        return sum(v for k, v in self.kept if k not in leave_out)


class Ledger:
    """Running total of allocated bytes, its peak, what autograd keeps (by kind) and the weight cache."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.peak = level
        self.kept: dict[str, int] = {}
        self.cache = 0
        """Autocast weight copies alive only in autocast's cache (freed when autocast exits)."""
        self.host = 0
        """Bytes kept for backward in host memory (offloaded activations)."""
        self.allocated = 0
        """Bytes allocated in all (what the ops wrote)."""

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.level += nbytes
        self.peak = max(self.peak, self.level)

    def free(self, nbytes: int) -> None:
        self.level -= nbytes

    def adopt(self, kind: str, nbytes: int) -> None:
        """Count live bytes as kept for backward (no allocation: the tensor exists already)."""
        self.kept[kind] = self.kept.get(kind, 0) + nbytes

    def hold(self, kind: str, nbytes: int, save: bool) -> None:
        """Allocate a tensor that autograd keeps when `save` (grad mode, block not checkpointed)."""
        self.alloc(nbytes)
        if save:
            self.adopt(kind, nbytes)

    def drop(self, nbytes: int, save: bool) -> None:
        """Last use of a tensor that `hold` allocated: freed unless autograd keeps it."""
        if not save:
            self.free(nbytes)

    def weight_copy(self, nbytes: int, save: bool) -> None:
        """Autocast casts a weight: saved by the matmul in grad mode, else alive in the cache only."""
        self.hold("autocast_copies", nbytes, save)
        if not save:
            self.cache += nbytes

    def exit_autocast(self) -> None:
        self.free(self.cache)
        self.cache = 0

    def offload(self, nbytes: int) -> None:
        """Kept bytes whose copy to host memory has finished: freed on the device, held on the host."""
        self.free(nbytes)
        self.adopt("offloaded", -nbytes)
        self.host += nbytes

    def fetch(self, nbytes: int) -> None:
        """Offloaded bytes copied back for the backward (their release is the backward's)."""
        self.alloc(nbytes)
        self.host -= nbytes

    def start_phase(self) -> None:
        self.peak = self.level

    def apply(self, segment: Segment) -> None:
        """Replay a recorded segment from the current level."""
        self.peak = max(self.peak, self.level + segment.rise)
        self.level += segment.delta
        self.cache += segment.cache
        self.host += segment.host
        for kind, nbytes in segment.kept:
            self.adopt(kind, nbytes)


def record(run: Callable[[Ledger], None]) -> Segment:
    """The segment of the operations `run` performs on a fresh ledger."""
    led = Ledger(0)
    run(led)
    return Segment(delta=led.level, rise=led.peak, cache=led.cache, kept=tuple(led.kept.items()),
                   host=led.host)
