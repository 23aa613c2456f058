"""On a CPU, which aten op each moment of a thread's time belongs to: self time, no time lost.

Why: on a CPU there are no device kernels, so `lmscope profile`'s kernel tables list aten ops
instead (`kernels.load_trace`). Taking each op's whole interval would count a nested op's time
again in every op around it; taking only innermost ops would drop the work an op does around
its nested calls (the GEMM of an `aten::addmm`, which copies its bias in with an `aten::copy_`).

What: torch.profiler records CPU ops as nested intervals per thread (`aten::linear` >
`aten::addmm` > `aten::copy_`). An op's *self time* is its interval less those of the ops nested
in it, so each moment goes to the innermost op running then: `aten::addmm` keeps its GEMM, its
nested `aten::copy_` keeps the copy. An op that does no work of its own (views, allocations,
flag checks: category `other` of `kernel_categories`) is credited under its own name only at
top level; nested, its self time goes to the nearest op around it that does work, or to the
top-level op when none does: the `aten::expand` inside `aten::addmm` and the `aten::resolve_conj`
inside `aten::mm` are part of the matmul, the `aten::empty` that `aten::mkldnn_convolution`
allocates its output with is part of the convolution. An op that does work is credited under
its own name at any depth. Ops on one thread nest, so summed over a thread the credited time is
the union of its top-level ops: nothing counted twice, nothing dropped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from lmscope.measure.intervals import merged
from lmscope.measure.kernel_categories import classify


@dataclass(frozen=True)
class OpTime:
    """The time credited to one op call: where it ran on its own (its self time)."""

    name: str
    thread: Any
    start_ns: int
    """When the op was called (its 'launch')."""
    segments: tuple[tuple[int, int], ...]
    """Disjoint [start, end) intervals in time order, with no op that has its own credit inside;
    one empty interval at its start for an op that took no time."""

    @property
    def self_ns(self) -> int:
        """Its self time: the length of its segments."""
        return sum(end - start for start, end in self.segments)


def op_self_times(ops: Iterable[tuple[Any, str, int, int]]) -> list[OpTime]:
    """Self time of each op call from (thread, name, start_ns, end_ns), per the module's rule.

    Left out: a nested op that does no work (its time is its owner's), and an op whose whole
    interval is credited to ops nested in it (an `aten::matmul` around an `aten::mm`). An op
    without nested ops is kept even when it took no time.
    """
    by_thread: dict[Any, list[tuple[int, int, str]]] = defaultdict(list)
    for thread, name, start, end in ops:
        by_thread[thread].append((start, max(start, end), name))
    credited: list[OpTime] = []
    for thread, nodes in by_thread.items():
        nodes.sort(key=lambda n: (n[0], -n[1]))
        credited.extend(_thread_self_times(thread, nodes))
    return credited


def _thread_self_times(thread: Any, nodes: list[tuple[int, int, str]]) -> list[OpTime]:
    """Self times on one thread; `nodes` sorted by start, outer before inner at equal starts."""
    parents: list[int | None] = []
    stack: list[int] = []
    for start, _, _ in nodes:
        while stack and nodes[stack[-1]][1] <= start:
            stack.pop()
        parents.append(stack[-1] if stack else None)
        stack.append(len(parents) - 1)
    owner: list[int] = []
    children: dict[int, list[int]] = defaultdict(list)
    for index, parent in enumerate(parents):
        does_work = classify(nodes[index][2]) != "other"
        owner.append(index if parent is None or does_work else owner[parent])
        if parent is not None:
            children[parent].append(index)
    segments: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for index, (start, end, _) in enumerate(nodes):
        cursor = start
        for child in children[index]:  # in start order, disjoint from each other
            child_start, child_end = nodes[child][0], min(nodes[child][1], end)
            if child_start > cursor:
                segments[owner[index]].append((cursor, child_start))
            cursor = max(cursor, child_end)
        if end > cursor:
            segments[owner[index]].append((cursor, end))
    out = []
    for index, (start, _, name) in enumerate(nodes):
        if owner[index] != index:
            continue
        pieces = merged(segments[index])  # a child folded into its owner leaves no seam
        if pieces or not children[index]:
            out.append(OpTime(name, thread, start, tuple(pieces) or ((start, start),)))
    return out

