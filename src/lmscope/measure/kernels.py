"""torch.profiler -> kernel tables per phase of a step; the same KernelRow that `nsys stats` fills.

`record_trace` runs measured steps under torch.profiler (CPU + CUDA activities, one profiler
warm-up step that is not recorded) and writes a Chrome/Perfetto trace. `load_trace` reads such
a trace back:

* On a GPU the "kernels" are the device activities (trace categories kernel, gpu_memcpy,
  gpu_memset). Each is tied to the host call that launched it (the cuda_runtime or cuda_driver
  event with the same `correlation` id). A kernel belongs to a named range (a phase such as
  `backward`, an `attention/softmax` call, a `step`) when its launch happened inside that
  range's host interval: a kernel launched from the autograd thread during `backward` counts
  for backward, though it runs later on the GPU.
* On a CPU there are no device activities: aten ops stand in for kernels, each credited with
  its self time (its interval less the ops nested in it; see `cpu_self_time`), launched at its
  own start, so the same tables and checks run anywhere.

`phase_stats` then gives, per phase, the kernel summary (Nsight's columns), GPU time by
category, launches, busy time against the phase's wall time, and the largest idle gaps.
Times are integer nanoseconds inside, as in `nsys stats`.
"""

from __future__ import annotations

import bisect
import gzip
import heapq
import json
import statistics
import timeit
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmscope.measure.cpu_self_time import op_self_times
from lmscope.measure.intervals import covered_ns
from lmscope.measure.kernel_categories import CATEGORIES, classify
from lmscope.measure.ranges import phase
from lmscope.measure.timer import synchronize

STEP = "step"
"""Name of the range around one whole measured step (synchronize included)."""
PHASES = ("forward", "backward", "optimizer")
"""Ranges that TrainStep opens inside a step, in order."""
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
TOLERANCE_NS = 20_000
TOLERANCE_FRAC = 0.002
"""Slack of the kernel-time <= wall-time check: GPU timestamps are mapped onto the host clock."""


@dataclass(frozen=True)
class Activity:
    """One kernel (or memcpy/memset, or on a CPU one innermost aten op)."""

    name: str
    start_ns: int
    dur_ns: int
    launch_ns: int
    """Host time of the call that launched it (its own start for CPU ops)."""
    lane: str
    """Stream (GPU) or thread (CPU): activities on one lane run one after another."""
    segments: tuple[tuple[int, int], ...] = ()
    """Where it ran when not in one piece (a CPU op's self time around the ops nested in it);
    empty for one interval from start_ns. Their lengths sum to dur_ns."""

    @property
    def end_ns(self) -> int:
        return self.segments[-1][1] if self.segments else self.start_ns + self.dur_ns

    def intervals(self) -> tuple[tuple[int, int], ...]:
        """The [start, end) intervals in which it ran, in time order."""
        return self.segments or ((self.start_ns, self.start_ns + self.dur_ns),)


@dataclass(frozen=True)
class Span:
    """One host-side named range (record_function / NVTX) of the trace."""

    name: str
    start_ns: int
    end_ns: int

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass
class Trace:
    """Activities (sorted by launch) and named ranges (sorted by start) of one recording."""

    activities: list[Activity]
    spans: list[Span]
    on_gpu: bool
    _launches: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.activities.sort(key=lambda a: (a.launch_ns, a.start_ns))
        self.spans.sort(key=lambda s: (s.start_ns, -s.end_ns))
        self._launches = [a.launch_ns for a in self.activities]

    def launched_in(self, start_ns: int, end_ns: int) -> list[Activity]:
        """Activities whose launch lies in [start_ns, end_ns)."""
        low = bisect.bisect_left(self._launches, start_ns)
        high = bisect.bisect_left(self._launches, end_ns)
        return self.activities[low:high]

    def spans_named(self, name: str, within: Span | None = None) -> list[Span]:
        """Ranges called `name` (inside `within` when given), in time order."""
        return [
            s for s in self.spans
            if s.name == name and (within is None or within.start_ns <= s.start_ns <= within.end_ns)
        ]


def record_trace(
    step: Callable[[], None], *, steps: int, device: torch.device, path: Path
) -> list[float]:
    """Run `steps` profiled steps (after one unrecorded profiler warm-up step) into a trace at `path`.

    Each step runs inside a `step` range that ends after a device synchronize, so every kernel
    a step launches finishes inside its range. Returns the host wall time of each recorded step
    in ms. A path ending in .gz is written gzipped (Perfetto opens either).
    """
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    path.parent.mkdir(parents=True, exist_ok=True)
    times: list[float] = []
    with torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=steps, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),
    ) as prof:
        for index in range(steps + 1):
            synchronize(device)
            begin = timeit.default_timer()
            with phase(STEP):
                step()
                synchronize(device)
            if index:  # step 0 is the profiler's own warm-up, not recorded
                times.append((timeit.default_timer() - begin) * 1e3)
            prof.step()
    return times


def load_trace(path: Path) -> Trace:
    """Read a Chrome trace written by torch.profiler (plain or .gz)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        data = json.load(handle)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return parse_events(events)


def _ns(microseconds: float) -> int:
    return round(float(microseconds) * 1000)


def parse_events(events: Iterable[dict[str, Any]]) -> Trace:
    """Build a Trace from Chrome trace events (only complete 'X' events are used)."""
    device, ops, spans, launches = [], [], [], {}
    for event in events:
        if event.get("ph") != "X":
            continue
        category = event.get("cat")
        if category in DEVICE_CATEGORIES:
            device.append(event)
        elif category in LAUNCH_CATEGORIES:
            correlation = (event.get("args") or {}).get("correlation")
            if correlation is not None:
                launches[correlation] = _ns(event["ts"])
        elif category == "cpu_op":
            ops.append(event)
        elif category == "user_annotation":
            start = _ns(event["ts"])
            spans.append(Span(event["name"], start, start + _ns(event.get("dur", 0))))
    if device:
        return Trace([_device_activity(e, launches) for e in device], spans, on_gpu=True)
    return Trace(_cpu_op_activities(ops), spans, on_gpu=False)


def _device_activity(event: dict[str, Any], launches: dict[Any, int]) -> Activity:
    args = event.get("args") or {}
    start = _ns(event["ts"])
    lane = f"device {args.get('device', event.get('pid'))} stream {args.get('stream', event.get('tid'))}"
    return Activity(event["name"], start, _ns(event.get("dur", 0)),
                    launches.get(args.get("correlation"), start), lane)


def _cpu_op_activities(ops: list[dict[str, Any]]) -> list[Activity]:
    """CPU ops standing in for kernels, each with its self time (see `cpu_self_time`)."""
    credited = op_self_times(
        (op.get("tid"), op["name"], _ns(op["ts"]), _ns(op["ts"]) + _ns(op.get("dur", 0))) for op in ops
    )
    return [Activity(op.name, op.segments[0][0], op.self_ns, op.start_ns, f"thread {op.thread}",
                     op.segments if len(op.segments) > 1 else ())
            for op in credited]


@dataclass(frozen=True)
class KernelRow:
    """One line of a kernel summary, with the columns of Nsight's CUDA GPU Kernel Summary."""

    name: str
    """Full (demangled) kernel name, or the aten op name on a CPU."""
    category: str
    time_pct: float
    """Share of the summed time of all kernels in the table, in %."""
    total_ns: float
    instances: int
    avg_ns: float
    med_ns: float
    min_ns: float
    max_ns: float
    stddev_ns: float
    """Sample standard deviation (0 for one instance)."""

    def per_step(self, steps: int) -> float:
        """Instances per step."""
        return self.instances / steps


def summarize_kernels(durations: dict[str, list[float]]) -> list[KernelRow]:
    """Kernel rows from each kernel name's durations, largest total time first."""
    grand = sum(sum(values) for values in durations.values())
    rows = [
        KernelRow(
            name=name, category=classify(name),
            time_pct=100.0 * sum(values) / grand if grand else 0.0,
            total_ns=float(sum(values)), instances=len(values),
            avg_ns=statistics.fmean(values), med_ns=float(statistics.median(values)),
            min_ns=float(min(values)), max_ns=float(max(values)),
            stddev_ns=statistics.stdev(values) if len(values) > 1 else 0.0,
        )
        for name, values in durations.items() if values
    ]
    return sorted(rows, key=lambda r: (-r.total_ns, -r.instances, r.name))


def category_times(rows: Iterable[KernelRow]) -> dict[str, float]:
    """Total ns per category (every category present, zeros included)."""
    totals = dict.fromkeys(CATEGORIES, 0.0)
    for row in rows:
        totals[row.category] += row.total_ns
    return totals


def fractions(times: dict[str, float]) -> dict[str, float]:
    """Each value over their sum (all zeros when the sum is zero)."""
    total = sum(times.values())
    return {key: (value / total if total else 0.0) for key, value in times.items()}


@dataclass(frozen=True)
class Gap:
    """An interval in a phase's window with no kernel of the phase running."""

    gap_ns: int
    step: int
    """Index of the measured step (0-based)."""
    offset_ns: int
    """Where the gap begins, from the start of its step."""
    before: str | None
    """Kernel that ran before the gap (None: the phase had not started any yet)."""
    after: str | None
    """Kernel that ran after it (None: the phase's last kernel had finished)."""


@dataclass(frozen=True)
class PhaseStats:
    """Kernel accounting of one phase (or the whole step) summed over the measured steps."""

    phase: str
    steps: int
    wall_ns: int
    """Phase windows on the device timeline: from when the device could start the phase (its
    range began and earlier work had drained) to the end of its range or of its last kernel."""
    busy_ns: int
    """Union of the phase's kernel intervals."""
    kernel_ns: int
    """Sum of kernel durations (exceeds busy_ns only where streams overlap)."""
    launches: int
    kernels: list[KernelRow]
    gaps: list[Gap]
    """Largest idle gaps, largest first."""
    violations: list[str]
    """Broken invariants (kernel time above wall time); empty when all holds."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary with per-step figures and category fractions."""
        times = category_times(self.kernels)
        per_step = 1e6 * self.steps
        return {
            "phase": self.phase,
            "steps": self.steps,
            "wall_ms_per_step": self.wall_ns / per_step,
            "busy_ms_per_step": self.busy_ns / per_step,
            "kernel_ms_per_step": self.kernel_ns / per_step,
            "idle_ms_per_step": max(self.wall_ns - self.busy_ns, 0) / per_step,
            "busy_frac": self.busy_ns / self.wall_ns if self.wall_ns else 0.0,
            "launches_per_step": self.launches / self.steps,
            "category_ms_per_step": {k: v / per_step for k, v in times.items()},
            "categories": fractions(times),
            "kernels": [asdict(row) for row in self.kernels],
            "gaps": [asdict(gap) for gap in self.gaps],
            "violations": list(self.violations),
        }


def step_spans(trace: Trace) -> list[Span]:
    """The measured steps of a trace, in order."""
    return trace.spans_named(STEP)


def phase_stats(trace: Trace, name: str, steps: Sequence[Span], *, top_gaps: int = 8) -> PhaseStats | None:
    """Accounting of phase `name` (or STEP) over `steps`; None when no step has that phase."""
    durations: dict[str, list[float]] = defaultdict(list)
    wall = busy = kernel = launches = 0
    gaps: list[Gap] = []
    violations: list[str] = []
    found = False
    for index, step in enumerate(steps):
        spans = [step] if name == STEP else trace.spans_named(name, within=step)
        for span in spans:
            found = True
            acts = trace.launched_in(span.start_ns, span.end_ns)
            begin, end = (step.start_ns, step.end_ns) if name == STEP else _window(trace, step, span, acts)
            span_busy = union_ns(acts)
            wall += end - begin
            busy += span_busy
            kernel += sum(a.dur_ns for a in acts)
            launches += len(acts)
            for act in acts:
                durations[act.name].append(act.dur_ns)
            gaps.extend(_gaps(acts, begin, end, index, step.start_ns))
            violations.extend(_check(name, index, acts, begin, end, span_busy))
    if not found:
        return None
    return PhaseStats(
        phase=name, steps=len(steps), wall_ns=wall, busy_ns=busy, kernel_ns=kernel, launches=launches,
        kernels=summarize_kernels(durations), gaps=heapq.nlargest(top_gaps, gaps, key=lambda g: g.gap_ns),
        violations=violations,
    )


def _window(trace: Trace, step: Span, span: Span, acts: list[Activity]) -> tuple[int, int]:
    """When the device could work on this phase: after its range began and earlier work drained."""
    earlier = trace.launched_in(step.start_ns, span.start_ns)
    begin = max([span.start_ns] + [a.end_ns for a in earlier])
    if acts:
        begin = min(begin, min(a.start_ns for a in acts))
        return begin, max(span.end_ns, max(a.end_ns for a in acts))
    return begin, max(begin, span.end_ns)


def union_ns(acts: Iterable[Activity]) -> int:
    """Time covered by at least one of the activities (overlapping ones, e.g. on two streams, once)."""
    return covered_ns(interval for act in acts for interval in act.intervals())


def _gaps(acts: list[Activity], begin: int, end: int, step: int, step_start: int) -> list[Gap]:
    """Idle intervals of [begin, end) between the activities (leading and trailing included)."""
    out, cursor, last = [], begin, None
    pieces = sorted((low, high, act.name) for act in acts for low, high in act.intervals())
    for low, high, name in pieces:
        if low > cursor:
            out.append(Gap(low - cursor, step, cursor - step_start, last, name))
        if high >= cursor:
            cursor, last = high, name
    if end > cursor:
        out.append(Gap(end - cursor, step, cursor - step_start, last, None))
    return out


def _check(name: str, step: int, acts: list[Activity], begin: int, end: int, busy: int) -> list[str]:
    """Kernel time inside a window can never exceed the window's wall time."""
    wall = end - begin
    slack = TOLERANCE_NS + TOLERANCE_FRAC * wall
    problems = []
    if busy > wall + slack:
        problems.append(f"step {step} {name}: busy kernel time {busy / 1e6:.3f} ms exceeds "
                        f"wall time {wall / 1e6:.3f} ms")
    per_lane: dict[str, int] = defaultdict(int)
    for act in acts:
        per_lane[act.lane] += act.dur_ns
    for lane, total in per_lane.items():
        if total > wall + slack:
            problems.append(f"step {step} {name}: kernels on {lane} sum to {total / 1e6:.3f} ms, "
                            f"more than the wall time {wall / 1e6:.3f} ms")
    outside = [a for a in acts if a.start_ns < begin - slack or a.end_ns > end + slack]
    if outside:
        problems.append(f"step {step} {name}: {len(outside)} kernel(s) run outside the range "
                        f"that launched them (first: {outside[0].name[:80]})")
    return problems


@dataclass(frozen=True)
class RangeCall:
    """GPU work launched inside the k-th call of a named range, median over the steps."""

    name: str
    index: int
    """Occurrence inside its parent range (the layer, for attention ranges in forward)."""
    gpu_ns: float
    """Summed duration of the kernels launched inside the range."""
    cpu_ns: float
    """Host duration of the range."""
    launches: float


def range_calls(trace: Trace, names: Sequence[str], parents: Sequence[Span]) -> list[RangeCall]:
    """Per call of each named range inside each parent (e.g. each step's forward), medians over parents."""
    samples: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for parent in parents:
        for name in names:
            for index, span in enumerate(trace.spans_named(name, within=parent)):
                acts = trace.launched_in(span.start_ns, span.end_ns)
                samples[(name, index)].append((sum(a.dur_ns for a in acts), span.dur_ns, len(acts)))
    return [
        RangeCall(name, index,
                  gpu_ns=float(statistics.median(s[0] for s in values)),
                  cpu_ns=float(statistics.median(s[1] for s in values)),
                  launches=float(statistics.median(s[2] for s in values)))
        for (name, index), values in sorted(samples.items(), key=lambda kv: (kv[0][1], names.index(kv[0][0])))
    ]
