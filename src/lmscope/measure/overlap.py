"""Where one rank's distributed step goes on the GPU: compute, exposed communication, idle; and
how long the host spent in a wrapper's hooks. Read from a torch.profiler trace (`kernels.Trace`).

Per measured step (the `step` range, which ends after a device synchronize), on the device
timeline of the activities that the step launched:

* **compute**: the union of the intervals of every device activity that is not communication
  (kernels, memcpy, memset; `kernel_categories.classify`).
* **communication**: the union of the communication kernels (NCCL). On a CPU (gloo) the
  "kernels" are the innermost aten ops, `c10d::*` among them, as in `lmscope profile`.
* **exposed communication**: communication while no compute runs (the union of both minus
  compute). It includes the time a collective waits for the other ranks to reach it.
* **idle**: the step's wall time when nothing runs, so wall = compute + exposed + idle.

Of several steps, the breakdown is that of the step whose wall time is the median (the lower
middle one of an even count): one step's parts, so that they add up, as medians taken part by
part would not.

Exposed communication is also split by the phase range (forward, backward, ...) whose host time
launched the collective. Host time: the ranges whose names start with one of `WRAPPER_RANGES`
(ours: `fsdp/pre_forward`, ...; FSDP2's: `FSDP::pre_forward (layers.0)`, ...), summed per name
(the part before ' (' ) and as their union (time when some hook ran).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from lmscope.measure.intervals import Interval, covered_ns, merged
from lmscope.measure.kernel_categories import classify
from lmscope.measure.kernels import Activity, Span, Trace

WRAPPER_RANGES = ("fsdp/", "FSDP::")
"""Prefixes of the profiler ranges of data-parallel wrappers' hooks (lmscope's FSDP, FSDP2)."""

@dataclass(frozen=True)
class StepBreakdown:
    """One rank's step whose wall time is the median of its measured steps, in ms."""

    steps: int
    wall_ms: float
    compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    idle_ms: float
    exposed_comm_by_phase_ms: dict[str, float] = field(default_factory=dict)
    """Exposed communication of the collectives launched inside each phase range."""
    host_ms: dict[str, float] = field(default_factory=dict)
    """Host time per wrapper range name (nested ranges are counted in their own name too)."""
    wrapper_host_ms: float = 0.0
    """Host time inside any wrapper range (their union)."""
    wrapper_calls: float = 0.0
    """Outermost wrapper ranges per step."""

    def as_record(self, prefix: str = "profile_") -> dict[str, float]:
        """Flat metrics for a row: `profile_compute_ms`, `profile_exposed_comm_backward_ms`, ..."""
        row = {f"{prefix}{name}": getattr(self, name) for name in
               ("wall_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "idle_ms", "wrapper_host_ms")}
        row[f"{prefix}wrapper_calls"] = self.wrapper_calls
        for phase, ms in self.exposed_comm_by_phase_ms.items():
            row[f"{prefix}exposed_comm_{phase}_ms"] = ms
        row.update({f"{prefix}host_{_key(name)}_ms": ms for name, ms in self.host_ms.items()})
        return row


def _key(name: str) -> str:
    """A range name as part of a metric name: 'FSDP::pre_forward' -> 'fsdp_pre_forward'."""
    return re.sub(r"\W+", "_", name).strip("_").lower()


def range_name(name: str) -> str:
    """A wrapper range's name without the module it ran for ('FSDP::pre_forward (layers.0)')."""
    return name.split(" (")[0].split(" for ")[0]


def step_breakdown(trace: Trace, steps: Sequence[Span], phases: Sequence[str],
                   prefixes: Sequence[str] = WRAPPER_RANGES) -> StepBreakdown:
    """The breakdown of `steps` (see the module docstring); `phases` name the ranges inside a
    step that split its exposed communication."""
    if not steps:
        raise ValueError("no measured steps in the trace: profile at least one step")
    parts = sorted((_one_step(trace, step, phases, prefixes) for step in steps), key=lambda p: p["wall"])
    median = parts[(len(parts) - 1) // 2]
    ms = {key: value / 1e6 for key, value in median.items() if key != "calls"}
    return StepBreakdown(
        steps=len(steps),
        wall_ms=ms["wall"], compute_ms=ms["compute"], comm_ms=ms["comm"],
        exposed_comm_ms=ms["exposed"], idle_ms=ms["idle"],
        exposed_comm_by_phase_ms={phase: ms.get(f"exposed/{phase}", 0.0) for phase in phases},
        host_ms={key.removeprefix("host/"): value for key, value in sorted(ms.items())
                 if key.startswith("host/")},
        wrapper_host_ms=ms["wrapper"],
        wrapper_calls=float(median["calls"]),
    )


def _one_step(trace: Trace, step: Span, phases: Sequence[str], prefixes: Sequence[str]) -> dict[str, int]:
    """ns of each part of one step, and `calls`: the number of outermost wrapper ranges."""
    acts = trace.launched_in(step.start_ns, step.end_ns)
    comm = [iv for a in acts if classify(a.name) == "communication" for iv in _clipped(a, step)]
    others = [iv for a in acts if classify(a.name) != "communication" for iv in _clipped(a, step)]
    compute, busy = covered_ns(others), covered_ns(others + comm)
    out = {"wall": step.dur_ns, "compute": compute, "comm": covered_ns(comm), "exposed": busy - compute,
           "idle": step.dur_ns - busy}
    for phase in phases:
        launched = [iv for span in trace.spans_named(phase, within=step) for a in acts
                    if classify(a.name) == "communication" and span.start_ns <= a.launch_ns < span.end_ns
                    for iv in _clipped(a, step)]
        out[f"exposed/{phase}"] = covered_ns(others + launched) - compute
    wrapper = [s for s in trace.spans
               if step.start_ns <= s.start_ns < step.end_ns and s.name.startswith(tuple(prefixes))]
    for span in wrapper:
        key = f"host/{range_name(span.name)}"
        out[key] = out.get(key, 0) + span.dur_ns
    outermost = merged((s.start_ns, s.end_ns) for s in wrapper)
    out["wrapper"] = sum(end - start for start, end in outermost)
    out["calls"] = len(outermost)
    return out


def _clipped(act: Activity, step: Span) -> list[Interval]:
    """Where `act` ran inside `step`: its intervals (a CPU op's self time comes in pieces around
    the ops nested in it, which its whole span would cover too) cut to the step."""
    return [(max(start, step.start_ns), min(end, step.end_ns)) for start, end in act.intervals()]
