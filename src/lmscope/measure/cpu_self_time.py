"""On a CPU, which aten op each moment of a thread's time belongs to: self time, no time lost.

torch.profiler records CPU ops as nested intervals per thread (`aten::linear` > `aten::addmm` >
`aten::copy_`). Each moment inside a top-level op belongs to the innermost op running then: an
op's *self time* is its interval less those of the ops nested in it. So `aten::addmm` keeps its
GEMM although it calls `aten::expand` and `aten::copy_` (which keep theirs), and
`aten::mkldnn_convolution` keeps its convolution although it allocates its output inside.

Ops that do no work of their own (views, allocations, flag checks: category `other`) fold into
the nearest op around them that does: the `aten::empty` inside a convolution is part of the
convolution, the `aten::resolve_conj` inside `aten::mm` part of the matmul. Only a top-level op,
or one under nothing but such ops, is credited under its own name. Summed over a thread, the
credited time is the union of its top-level ops: nothing counted twice, nothing dropped.
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
    """Disjoint [start, end) intervals in time order, with no op that has its own credit inside."""

    @property
    def self_ns(self) -> int:
        return sum(end - start for start, end in self.segments)


def op_self_times(ops: Iterable[tuple[Any, str, int, int]]) -> list[OpTime]:
    """Self time of each op call from (thread, name, start_ns, end_ns), per the module's rule.

    An op whose whole interval is credited to ops nested in it (an `aten::matmul` around an
    `aten::mm`) is left out; an op without nested ops is kept even when it took no time.
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

