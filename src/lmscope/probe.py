"""Probe: lmscope's measurements around a training loop the user already has, as lmscope Records.

    with Probe(device="cuda", warmup=3, out="runs/mine/results.jsonl") as probe:
        for batch in loader:
            with probe.phase("forward"):
                loss = model(batch).loss
            with probe.phase("backward"):
                loss.backward()
            with probe.phase("optimizer"):
                opt.step(); opt.zero_grad()
            probe.step()
    probe.record  # the row; `lmscope table runs/mine/results.jsonl` shows it

`step()` ends a step the way `torch.profiler`'s `prof.step()` does. On GPUs a step's time is
the time between CUDA events recorded at consecutive `step()` calls, and each `phase(name)` is
timed by an event pair: the probe never synchronizes inside the loop (the events are read once,
when the `with` block ends), so the host runs ahead as it does without the probe, and a step
measures what a plain CUDA-event loop around it measures. On CPUs the host clock times both.
Each phase carries an NVTX range and a profiler range (`lmscope.measure.ranges.phase`). The
first `warmup` steps are not recorded.
On GPUs each phase's allocated peak is measured (the allocator's peak reset at its start; the
step's peak is the largest phase peak). The peaks are the allocator's process-wide counts: they
include the user's model and optimizer state, built before the probe, and whatever else the
process holds; `allocated_at_start_gib` is what was allocated when the probe was entered, so
peak - it is what the loop added. `kernels=True` records the measured steps with
torch.profiler and adds each phase's kernel time and launches (their step times then include the
profiler's overhead). `measure_step` runs the loop itself for one model, batch and loss.
"""

from __future__ import annotations

import contextlib
import statistics
import timeit
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from lmscope.measure.kernels import STEP, load_trace, phase_stats, step_spans
from lmscope.measure.memory import MemoryMeter
from lmscope.measure.ranges import phase as named_range
from lmscope.measure.timer import PhaseClock, summarize, synchronize
from lmscope.records.results import Record, append_record, provenance

GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class Spec:
    """What a probe row measured: a label for the loop, its device, precision and warm-up."""

    label: str = "probe"
    """The user's name for the measured loop (a model, a variant)."""
    device: str = "cpu"
    """The device the loop ran on."""
    precision: str = "unknown"
    """Precision the loop ran at, as the user states it (measure_step: fp32 | bf16 | fp16)."""
    warmup: int = 1
    """Steps at the start that were not recorded."""

    def __post_init__(self) -> None:
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be 0 or more steps, got {self.warmup!r}")


class Probe:
    """Times named phases of each step of a loop; the row is `record` after the `with` block."""

    def __init__(self, label: str = "probe", *, device: str | torch.device = "cpu", warmup: int = 1,
                 precision: str = "unknown", tokens_per_step: int | None = None,
                 out: str | Path | None = None, kernels: bool = False,
                 trace_path: str | Path | None = None) -> None:
        self.device = torch.device(device)
        self.spec = Spec(label=label, device=str(self.device), precision=precision, warmup=warmup)
        if tokens_per_step is not None and tokens_per_step <= 0:
            raise ValueError(f"tokens_per_step must be positive, got {tokens_per_step!r}")
        if kernels and out is None and trace_path is None:
            raise ValueError("kernels=True writes a trace: pass out= or trace_path=")
        self.tokens_per_step = tokens_per_step
        self.out = Path(out) if out is not None else None
        self.kernels = kernels
        self.trace_path = Path(trace_path) if trace_path else (
            self.out.with_name(f"{label}.trace.json.gz") if kernels and self.out else None)
        self.meter = MemoryMeter(self.device) if self.device.type == "cuda" else None
        """Never entered: it reads the process's totals (the loop's model was built before the probe)."""
        self.allocated_at_start: int | None = None
        self.index = 0
        self.times_ms: list[float] = []
        self.phases_ms: dict[str, list[float]] = {}
        self.peaks: dict[str, int] = {}
        self.record: Record | None = None
        self._clocks: list[tuple[str, PhaseClock]] = []
        self._step_peaks: dict[str, int] = {}
        self._begin: object = 0.0
        self._measured: list[tuple[object, object, list[tuple[str, PhaseClock]]]] = []
        self._stack = contextlib.ExitStack()
        self._profiler: torch.profiler.profile | None = None
        self._step_range: contextlib.ExitStack | None = None

    def __enter__(self) -> Probe:
        synchronize(self.device)  # what ran before the loop stays out of its first step
        if self.meter is not None:
            self.allocated_at_start = self.meter.current()
        self._start_step()
        return self

    def _start_step(self) -> None:
        if self.kernels and self.index == self.spec.warmup:
            self._start_profiler()
        if self._profiler is not None:
            self._step_range = contextlib.ExitStack()
            self._step_range.enter_context(named_range(STEP))
        self._begin = self._now()

    def _now(self) -> object:
        """A CUDA event recorded now on GPUs (read at the end), the host clock on CPUs."""
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return timeit.default_timer()

    def _start_profiler(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = self._stack.enter_context(torch.profiler.profile(activities=activities))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the code inside as phase `name` of the current step (twice in a step: summed)."""
        clock = PhaseClock(self.device)
        if self.meter is not None:
            self.meter.reset_peak()
        with named_range(name):
            clock.start()
            yield
            clock.mark(name)
        if self.meter is not None:
            self._step_peaks[name] = max(self._step_peaks.get(name, 0), self.meter.peak())
        self._clocks.append((name, clock))

    def step(self) -> None:
        """End the current step: mark it (kept after warm-up) and start the next one."""
        end = self._now()
        if self._step_range is not None:
            self._step_range.close()
        if self.index >= self.spec.warmup:
            self._measured.append((self._begin, end, self._clocks))
            for name, peak in self._step_peaks.items():
                self.peaks[name] = max(self.peaks.get(name, 0), peak)
        self._clocks, self._step_peaks = [], {}
        self.index += 1
        self._start_step()

    def _read_times(self) -> None:
        """Step and phase times of the kept steps, read after one synchronize."""
        synchronize(self.device)
        for begin, end, clocks in self._measured:
            if self.device.type == "cuda":
                self.times_ms.append(begin.elapsed_time(end))  # type: ignore[union-attr]
            else:
                self.times_ms.append((end - begin) * 1e3)  # type: ignore[operator]
            per_step: dict[str, float] = {}
            for name, clock in clocks:
                per_step[name] = per_step.get(name, 0.0) + clock.elapsed_ms()[name]
            for name, ms in per_step.items():
                self.phases_ms.setdefault(name, []).append(ms)
        self._measured = []

    def __exit__(self, *exc: object) -> None:
        if self._step_range is not None:  # the unfinished step after the last step() call
            self._step_range.close()
        self._stack.close()
        self._read_times()
        if exc[0] is None:
            self.record = self._build_record()
            if self.out is not None:
                append_record(self.out, self.record)

    def _build_record(self) -> Record:
        if not self.times_ms:
            raise ValueError(f"the probe recorded no step: call probe.step() after each step, more "
                             f"than warmup={self.spec.warmup} times")
        stats = summarize(self.times_ms)
        record: Record = {"workload": "probe", **asdict(self.spec), **provenance(),
                          "status": "ok", "error": None, **stats.as_record(),
                          "times_ms": [round(t, 4) for t in self.times_ms]}
        record.update({f"{name}_ms": statistics.median(ms) for name, ms in self.phases_ms.items()})
        if self.tokens_per_step:
            record["tokens_per_s"] = self.tokens_per_step / (stats.median_ms / 1e3)
        if self.meter is not None:
            record.update({f"{name}_peak_allocated_gib": peak / GIB for name, peak in self.peaks.items()})
            record["peak_allocated_gib"] = max(self.peaks.values(), default=0) / GIB
            record["allocated_at_start_gib"] = self.allocated_at_start / GIB
        if self._profiler is not None:
            record.update(self._kernel_metrics())
        return record

    def _kernel_metrics(self) -> dict[str, Any]:
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        self._profiler.export_chrome_trace(str(self.trace_path))
        trace = load_trace(self.trace_path)
        steps = step_spans(trace)[: len(self.times_ms)]
        metrics: dict[str, Any] = {"trace_path": str(self.trace_path)}
        for name in self.phases_ms:
            stats = phase_stats(trace, name, steps)
            if stats is not None:
                summary = stats.as_dict()
                metrics[f"{name}_busy_ms"] = summary["busy_ms_per_step"]
                metrics[f"{name}_launches_per_step"] = summary["launches_per_step"]
        return metrics


def measure_step(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    optimizer: torch.optim.Optimizer | None = None,
    *,
    warmup: int = 3,
    steps: int = 10,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    label: str = "measure_step",
    tokens_per_step: int | None = None,
    out: str | Path | None = None,
) -> Record:
    """Time `steps` training steps (after `warmup`) of `loss_fn(model, batch)`: forward, backward
    and, with an optimizer, its step; returns the Record (and appends it to `out`).

    model and batch must already be on `device`; precision bf16/fp16 runs the forward under
    torch.autocast, fp32 without.
    """
    from lmscope.workloads.train_step import AUTOCAST_DTYPES, autocast_context

    if precision not in ("fp32", *AUTOCAST_DTYPES):
        raise ValueError(f"unknown precision {precision!r}: choose fp32, bf16 or fp16")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps!r}")
    device = torch.device(device)
    with Probe(label, device=device, warmup=warmup, precision=precision,
               tokens_per_step=tokens_per_step, out=out) as probe:
        for _ in range(warmup + steps):
            model.zero_grad(set_to_none=True)
            with probe.phase("forward"), autocast_context(precision, device):
                loss = loss_fn(model, batch)
            with probe.phase("backward"):
                loss.backward()
            if optimizer is not None:
                with probe.phase("optimizer"):
                    optimizer.step()
            probe.step()
    return probe.record
