"""Memory probes: the peak of each phase of a step, allocation-history snapshots, and reading them.

* `MemoryMeter`: allocated bytes (current, peak) and reserved bytes of a device, the point's own:
  what was allocated before the meter was entered is not counted. On GPUs these are the CUDA
  caching allocator's statistics (process-wide) minus the baseline read on entering (after garbage
  collection and emptying the allocator's cache), so a point reads the same in a fresh process and
  in one that already holds memory. On CPUs they are the bytes of the distinct tensor storages that
  ops create while the meter is entered (`LiveTensorBytes`, a dispatch mode): what a caching
  allocator would count as allocated, with no reserved memory; tensors from before never count.
* `PhasePeaks`: a clock for `TrainStep` (start / mark) that resets the peak at each phase start
  and reads it at the phase end, the way `reset_peak_memory_stats` + `max_memory_allocated` measure
  a phase. It can also drop a marker allocation at each boundary, which `build_timeline` finds in a
  snapshot's trace to tell the phases apart.
* `MemoryMeter.record` + `.dump`: the allocation history as a snapshot pickle in the format of
  `torch.cuda.memory._snapshot()` (`segments`, `device_traces`), which pytorch.org/memory_viz opens;
  on GPUs `torch.cuda.memory._record_memory_history(stacks="python")` and `_dump_snapshot` make it.
* `build_timeline`: the allocations of a trace as blocks alive over [start, end) in alloc/free
  event indices (`alloc` and `free_completed` actions; allocations made before the trace began are
  recovered from their frees and from the segments), and `top_allocations`: the largest, grouped
  by size and by the first frame of their stack in lmscope's or the user's code.
"""

from __future__ import annotations

import contextlib
import gc
import pickle
import re
import sys
import weakref
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lmscope.accounting.memory import GIB

MARKER = "lmscope_phase_marker"
"""Name of the function whose tiny allocation marks a phase boundary in a trace."""

MAX_FRAMES = 48
"""Python frames kept per allocation on CPU (innermost first, as torch records them)."""

_INTERNAL = re.compile(r"[/\\]torch[/\\]|[/\\]lib[/\\]python3\.\d+[/\\](?!site-packages)|^<")
"""Frames that are not lmscope's or the user's code: torch itself, the standard library, <frozen>."""


Frame = tuple[str, int, str]
"""(filename, line, function name)."""


def lmscope_phase_marker(device: torch.device) -> None:
    """Allocate and free one byte: an alloc/free pair in the trace whose stack names this function."""
    torch.empty(1, dtype=torch.uint8, device=device)


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of the distinct storages that ops create while active (and their peak), on any device.

    A storage counts from the op that made it until it is freed (a weak reference's callback), as
    a caching allocator counts a block. With `history`, every allocation and free is also kept as
    a trace entry with its Python stack, in torch's snapshot format.
    """

    def __init__(self) -> None:
        super().__init__()
        self.current = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.history: deque[dict[str, Any]] | None = None
        """Trace entries while recording (the latest `maxlen`), else None."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        return out

    def _track(self, tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. sparse)
            return
        key = storage._cdata
        if key in self._sizes:
            return
        size = storage.nbytes()
        self._sizes[key] = size
        self.current += size
        self.peak = max(self.peak, self.current)
        self._refs[key] = weakref.ref(storage, lambda _, key=key: self._release(key))
        if self.history is not None:
            self._trace("alloc", key, size, _python_frames())

    def _release(self, key: int) -> None:
        size = self._sizes.pop(key, 0)
        self._refs.pop(key, None)
        self.current -= size
        if self.history is not None:
            self._trace("free_completed", key, size, [])

    def _trace(self, action: str, key: int, size: int, frames: list[dict[str, Any]]) -> None:
        self.history.append({"action": action, "addr": key, "size": size, "stream": 0, "frames": frames})

    def snapshot(self) -> dict[str, Any]:
        """The recorded history in torch's snapshot format; each live storage is a one-block segment."""
        segments = [
            {"device": 0, "address": key, "total_size": size, "allocated_size": size, "active_size": size,
             "requested_size": size, "stream": 0, "segment_type": "large" if size > 2**20 else "small",
             "segment_pool_id": (0, 0),
             "blocks": [{"address": key, "size": size, "requested_size": size,
                         "state": "active_allocated", "frames": []}]}
            for key, size in self._sizes.items()
        ]
        return {"segments": segments, "device_traces": [list(self.history or [])]}


def _python_frames() -> list[dict[str, Any]]:
    frames = []
    frame = sys._getframe(3)  # the op's caller: skip _python_frames, _track, __torch_dispatch__
    while frame is not None and len(frames) < MAX_FRAMES:
        frames.append({"filename": frame.f_code.co_filename, "line": frame.f_lineno,
                       "name": frame.f_code.co_name})
        frame = frame.f_back
    return frames


class MemoryMeter:
    """Allocated and reserved bytes of one device, counted from when the meter is entered.

    On CPUs, enter it before building the model (only tensors made inside count). On GPUs,
    entering it (or `take_baseline`) collects garbage, empties the caching allocator's cache and
    reads the baseline: the bytes still allocated then (what the process held before: another
    model, a notebook's tensors, a test's leftovers) and the bytes still reserved (the segments that
    hold them). current/peak are allocated bytes minus `baseline_allocated`; reserved/peak_reserved
    are reserved bytes minus `baseline_reserved`: what the point made the allocator reserve. In a
    process that holds memory, a point can reuse free room inside the segments it found, so its
    reserved bytes can be a little under a fresh process's; its allocated bytes are the same. A
    meter never entered counts from 0 (the process's totals).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._live = None if self.cuda else LiveTensorBytes()
        self._stack = contextlib.ExitStack()
        self.baseline_allocated = 0
        """Bytes allocated (process-wide) when the meter was entered; 0 on CPUs."""
        self.baseline_reserved = 0
        """Bytes reserved (process-wide) when the meter was entered, after emptying the cache; 0 on CPUs."""

    def __enter__(self) -> MemoryMeter:
        self.take_baseline()
        if self._live is not None:
            self._stack.enter_context(self._live)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def release(self) -> None:
        """Collect garbage (freed now, not in the middle of what is measured next); on GPUs also
        give the cached memory back and start new peaks. The baseline stays."""
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)

    def take_baseline(self) -> MemoryMeter:
        """On GPUs: `release`, then read the baseline (CPUs: no-op)."""
        if self.cuda:
            self.release()
            self.baseline_allocated = torch.cuda.memory_allocated(self.device)
            self.baseline_reserved = torch.cuda.memory_reserved(self.device)
        return self

    @property
    def baseline_allocated_gib(self) -> float | None:
        """The baseline's allocated bytes in GiB, for a row; None on CPUs."""
        return self.baseline_allocated / GIB if self.cuda else None

    def current(self) -> int:
        """Bytes allocated now, beyond the baseline."""
        if self.cuda:
            return torch.cuda.memory_allocated(self.device) - self.baseline_allocated
        return self._live.current

    def peak(self) -> int:
        """Highest bytes allocated since the last reset_peak, beyond the baseline."""
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) - self.baseline_allocated
        return self._live.peak

    def requested_peak(self) -> int:
        """Highest bytes requested since the last reset_peak, process-wide: the tensors' own
        sizes, before the caching allocator rounds each block up (docs/memory.md). A snapshot's
        trace counts these, so its timeline peaks here, not at `peak`. CPUs: the live tensors'
        peak (no rounding, no baseline). An allocator backend that does not count requested
        bytes (cudaMallocAsync) gives its allocated peak."""
        if self.cuda:
            requested = torch.cuda.memory_stats(self.device).get("requested_bytes.all.peak")
            return torch.cuda.max_memory_allocated(self.device) if requested is None else requested
        return self._live.peak

    def reserved(self) -> int | None:
        """Bytes the caching allocator holds now beyond the baseline's (None on CPU)."""
        return torch.cuda.memory_reserved(self.device) - self.baseline_reserved if self.cuda else None

    def peak_reserved(self) -> int | None:
        """Highest bytes reserved since the last reset_peak, beyond the baseline's (None on CPU)."""
        return torch.cuda.max_memory_reserved(self.device) - self.baseline_reserved if self.cuda else None

    def reset_peak(self) -> None:
        """Start a new peak from the current allocation."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._live.peak = self._live.current

    @contextlib.contextmanager
    def record(self, max_entries: int) -> Iterator[None]:
        """Keep the allocation history (the last `max_entries` events, Python stacks) inside."""
        if self.cuda:
            torch.cuda.memory._record_memory_history(
                enabled="all", context="all", stacks="python", max_entries=max_entries
            )
        else:
            self._live.history = deque(maxlen=max_entries)
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.memory._record_memory_history(enabled=None)
            else:
                self._live.history = None

    def dump(self, path: Path) -> Path:
        """Write the snapshot pickle (call inside `record`); pytorch.org/memory_viz opens it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.cuda:
            torch.cuda.memory._dump_snapshot(str(path))
        else:
            path.write_bytes(pickle.dumps(self._live.snapshot()))
        return path


class PhasePeaks:
    """A TrainStep clock that measures the allocated (and reserved) peak of each phase."""

    def __init__(self, meter: MemoryMeter, *, markers: bool = False) -> None:
        self.meter = meter
        self.markers = markers
        self.peaks: dict[str, tuple[int, int | None]] = {}
        """Phase name -> (peak allocated, peak reserved), in the order the phases ran."""
        self.start_bytes = 0
        """Bytes allocated when the step began."""
        self.requested_peak = 0
        """The step's highest requested bytes, process-wide (`MemoryMeter.requested_peak`)."""

    def start(self) -> None:
        self.peaks = {}
        self.requested_peak = 0
        self.meter.reset_peak()
        self.start_bytes = self.meter.current()
        if self.markers:
            lmscope_phase_marker(self.meter.device)

    def mark(self, name: str) -> None:
        self.peaks[name] = (self.meter.peak(), self.meter.peak_reserved())
        self.requested_peak = max(self.requested_peak, self.meter.requested_peak())
        self.meter.reset_peak()
        if self.markers:
            lmscope_phase_marker(self.meter.device)


def load_snapshot(path: Path) -> dict[str, Any]:
    """A snapshot pickle written by torch (or by MemoryMeter.dump)."""
    with Path(path).open("rb") as handle:
        snapshot = pickle.load(handle)  # noqa: S301 - the user's own snapshot file
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError(f"{path} is not a memory snapshot: expected a dict with device_traces")
    return snapshot


@dataclass(frozen=True)
class Block:
    """One allocation over the trace: alive over event indices [start, end)."""

    size: int
    start: int
    """Event index of its alloc; -1 when it was allocated before the trace began."""
    end: int
    frames: tuple[Frame, ...]
    """Python stack of its allocation, innermost first (empty when unknown)."""


@dataclass(frozen=True)
class Timeline:
    """The allocations of one device's trace, and the phase boundaries found in it."""

    blocks: tuple[Block, ...]
    events: int
    """Number of alloc/free events: the time axis."""
    boundaries: tuple[tuple[int, str], ...]
    """(event index, name of the phase that starts there)."""

    def active(self) -> np.ndarray:
        """Bytes requested after each event (allocations from before the trace included): the
        trace's sizes, which the caching allocator's allocated bytes exceed by its rounding
        (`MemoryMeter.requested_peak`)."""
        delta = np.zeros(self.events + 1, dtype=np.int64)
        for block in self.blocks:
            delta[max(block.start, 0)] += block.size
            delta[block.end] -= block.size
        return np.cumsum(delta)[: self.events]

    def phase_at(self, index: int) -> str:
        """Name of the phase an event belongs to ('' before the first boundary)."""
        name = ""
        for at, phase_name in self.boundaries:
            if at <= index:
                name = phase_name
        return name


def _frames(entry: dict[str, Any]) -> tuple[Frame, ...]:
    return tuple((f.get("filename", "?"), int(f.get("line", 0)), f.get("name", "?"))
                 for f in entry.get("frames") or [])


def _device_trace(snapshot: dict[str, Any], device: int | None) -> tuple[int, list[dict[str, Any]]]:
    traces = snapshot.get("device_traces") or [[]]
    if device is None:
        device = max(range(len(traces)), key=lambda i: len(traces[i]))
    if not 0 <= device < len(traces):
        raise ValueError(f"the snapshot has traces for {len(traces)} device(s), not device {device}")
    return device, traces[device]


def build_timeline(snapshot: dict[str, Any], *, phases: Sequence[str] | None = None,
                   device: int | None = None) -> Timeline:
    """Reconstruct the active allocations over one device's trace (the busiest one by default).

    Phase boundaries are the marker allocations of `PhasePeaks(markers=True)`; `phases` names the
    phases in order (as the step marked them), else they are called phase 1, phase 2, ...
    """
    device, trace = _device_trace(snapshot, device)
    events = [e for e in trace if e.get("action") in ("alloc", "free_completed")]
    live: dict[int, tuple[int, int, tuple[Frame, ...]]] = {}
    blocks: list[Block] = []
    marks: list[int] = []
    markers: set[int] = set()
    index = 0
    for entry in events:
        addr, size = entry.get("addr"), int(entry.get("size", 0))
        if entry["action"] == "alloc":
            frames = _frames(entry)
            if any(name == MARKER for _, _, name in frames):
                marks.append(index)
                markers.add(addr)
                continue
            live[addr] = (size, index, frames)
        elif addr in markers:
            markers.discard(addr)
            continue
        elif addr in live:
            size, start, frames = live.pop(addr)
            blocks.append(Block(size, start, index, frames))
        else:  # allocated before the trace began
            blocks.append(Block(size, -1, index, ()))
        index += 1
    blocks += [Block(size, start, index, frames) for size, start, frames in live.values()]
    in_trace = {e.get("addr") for e in events}
    for segment in snapshot.get("segments") or []:
        if segment.get("device", device) != device:
            continue
        for block in segment.get("blocks") or []:  # allocated before the trace, still alive
            if block.get("state") == "active_allocated" and block.get("address") not in in_trace:
                size = block.get("requested_size", block["size"])  # as the trace counts
                blocks.append(Block(int(size), -1, index, _frames(block)))
    names = list(phases) if phases is not None else [f"phase {i + 1}" for i in range(len(marks))]
    boundaries = tuple((at, names[i] if i < len(names) else "after") for i, at in enumerate(marks))
    return Timeline(tuple(blocks), index, boundaries)


def site(frames: Sequence[Frame]) -> str:
    """The innermost frame in lmscope's or the user's code, as 'path:line function'."""
    for filename, line, name in frames:
        if not _INTERNAL.search(filename):
            short = filename.replace("\\", "/")
            short = short.split("/lmscope/", 1)[1] if "/lmscope/" in short else short.rsplit("/", 1)[-1]
            return f"{short}:{line} {name}"
    return "no Python frame (autograd engine or C++)" if not frames else "torch internals"


@dataclass(frozen=True)
class AllocationGroup:
    """Allocations of one size from one site in the recorded step."""

    size: int
    count: int
    site: str
    phase: str
    """Phase of the first of them."""

    def as_record(self) -> dict[str, Any]:
        return {"size_mib": self.size / 2**20, "count": self.count, "site": self.site, "phase": self.phase}


def top_allocations(timeline: Timeline, n: int = 10) -> list[AllocationGroup]:
    """The `n` largest groups (size, site) among allocations made during the trace, largest first."""
    counts: Counter[tuple[int, str]] = Counter()
    first: dict[tuple[int, str], str] = {}
    for block in sorted((b for b in timeline.blocks if b.start >= 0), key=lambda b: b.start):
        key = (block.size, site(block.frames))
        counts[key] += 1
        first.setdefault(key, timeline.phase_at(block.start))
    ranked = sorted(counts.items(), key=lambda item: (-item[0][0], -item[1]))[:n]
    return [AllocationGroup(size, count, where, first[(size, where)]) for (size, where), count in ranked]
