"""Timing: warm-up, synchronized steps, per-phase marks, statistics.

Step times use `timeit.default_timer` with a device synchronize after every step, the method of
the study. Phases inside a step are marked with CUDA events on GPUs (read after the step's
synchronize, so the step itself has no extra host sync) and with the host clock on CPUs. With a
`lmscope.measure.sampling.StopRule`, the timed steps go on past the minimum count until the
median is known to the asked precision or the time budget is spent.
"""

from __future__ import annotations

import math
import statistics
import timeit
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from lmscope.measure.sampling import Sampler, StopRule


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on `device` (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation, as numpy's default."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of an empty list")
    pos = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(pos), math.ceil(pos)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass(frozen=True)
class TimingStats:
    """Summary of repeated measurements, in milliseconds."""

    mean_ms: float
    std_ms: float
    median_ms: float
    min_ms: float
    max_ms: float
    p20_ms: float
    p80_ms: float
    n: int

    def as_record(self, prefix: str = "") -> dict[str, float]:
        """Flat dict with keys like '{prefix}mean_ms' (n becomes '{prefix}n')."""
        return {f"{prefix}{key}": value for key, value in asdict(self).items()}


def summarize(times_ms: list[float]) -> TimingStats:
    """Mean, sample std (0 for one value), median, min, max, p20, p80 of `times_ms`."""
    if not times_ms:
        raise ValueError("no timings to summarize: run at least one measured step")
    return TimingStats(
        mean_ms=statistics.fmean(times_ms),
        std_ms=statistics.stdev(times_ms) if len(times_ms) > 1 else 0.0,
        median_ms=statistics.median(times_ms),
        min_ms=min(times_ms),
        max_ms=max(times_ms),
        p20_ms=percentile(times_ms, 20),
        p80_ms=percentile(times_ms, 80),
        n=len(times_ms),
    )


class PhaseClock:
    """Marks phase boundaries inside one step; `elapsed_ms()` after the step's synchronize."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._marks: list[tuple[str, object]] = []

    def _now(self) -> object:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return timeit.default_timer()

    def start(self) -> None:
        """Open the first phase."""
        self._marks = [("", self._now())]

    def mark(self, name: str) -> None:
        """Close the phase called `name` (it began at the previous mark)."""
        self._marks.append((name, self._now()))

    def elapsed_ms(self) -> dict[str, float]:
        """Duration of each marked phase; call only after the device is synchronized."""
        out: dict[str, float] = {}
        for (_, begin), (name, end) in zip(self._marks, self._marks[1:], strict=False):
            if self._cuda:
                out[name] = begin.elapsed_time(end)  # type: ignore[union-attr]
            else:
                out[name] = (end - begin) * 1e3  # type: ignore[operator]
        return out


@dataclass
class PhasedSteps:
    """What `time_phased_steps` measured: step times, phase times per step, step return values,
    and why the timing stopped (`lmscope.measure.sampling`)."""

    times_ms: list[float] = field(default_factory=list)
    phases_ms: dict[str, list[float]] = field(default_factory=dict)
    results: list[Any] = field(default_factory=list)
    stop_reason: str = "steps"


def time_phased_steps(
    step: Callable[[PhaseClock], Any],
    *,
    warmup: int,
    steps: int,
    device: torch.device,
    after_warmup: Callable[[], None] | None = None,
    before_each: Callable[[], None] | None = None,
    after_each: Callable[[], None] | None = None,
    stop: StopRule | None = None,
) -> PhasedSteps:
    """Run `warmup` untimed steps, then `steps` timed ones, each ending in a synchronize; with a
    `stop` rule that has a target, `steps` is the minimum and timing goes on until the rule stops it.

    `step(clock)` marks its phases on `clock` (CUDA events on GPUs, so no extra host sync); the
    hooks run outside the timed region (e.g. to reset or read the allocator's peak).
    """
    clock = PhaseClock(device)
    for _ in range(warmup):
        step(clock)
        synchronize(device)
    if after_warmup:
        after_warmup()
    measured = PhasedSteps()
    sampler = Sampler(stop or StopRule(), steps)
    started = timeit.default_timer()
    while (reason := sampler.stop_reason(measured.times_ms, timeit.default_timer() - started)) is None:
        if before_each:
            before_each()
        synchronize(device)
        begin = timeit.default_timer()
        measured.results.append(step(clock))
        synchronize(device)
        measured.times_ms.append((timeit.default_timer() - begin) * 1e3)
        if after_each:
            after_each()
        for name, ms in clock.elapsed_ms().items():
            measured.phases_ms.setdefault(name, []).append(ms)
    measured.stop_reason = reason
    return measured


def time_steps(
    step: Callable[[], None], *, warmup: int, steps: int, device: torch.device
) -> list[float]:
    """Run `warmup` untimed steps, then `steps` timed ones; each step ends in a synchronize."""
    return time_phased_steps(lambda clock: step(), warmup=warmup, steps=steps, device=device).times_ms
