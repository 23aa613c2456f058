"""Sweeps of a grid's points (`lmscope.inputs.grid`): isolated worker processes, timeouts, OOM capture,
resume.

Every command goes through `run_sweep`: each point runs in a worker process
(`lmscope.running.point_worker`) in its own process group, so an OOM, a crash or a hang costs that
point only; it becomes a record with status `oom`, `error` or `timeout` and the sweep goes on.
Records are appended to the results file as each point finishes, so an interrupted sweep
loses nothing that finished, and `resume=True` skips points whose `ok` or `oom` record is
already there (errors and timeouts are tried again: they may be transient).

`rounds=R` runs the whole list of points R times in order (A, B, A, B, ...), so drift of the
machine (clocks, temperature, a neighbour's load) hits every point alike. Each round of a point is
its own row with `round` (0..R-1) and `rounds` (R); `round` is part of the point's identity, so
an interrupted run resumes at the round it reached. Reports pool the rounds' per-step times.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import timeit
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from lmscope.inputs.limits import check_steps
from lmscope.measure.device_memory import release_device_memory
from lmscope.records.results import Record, append_record, point_key, provenance, read_records
from lmscope.running.point_worker import PointWorker

WORKLOADS: dict[str, str] = {
    "bench": "lmscope.workloads.step",
    "profile": "lmscope.workloads.profile",
    "memory": "lmscope.workloads.memory",
    "attention": "lmscope.workloads.attention",
    "comm": "lmscope.workloads.collectives",
    "ddp": "lmscope.workloads.ddp",
    "probe": "lmscope.probe",
}
"""Workload name -> module. A workload module defines `Spec` (a frozen dataclass) and
`run_point(spec_dict) -> metrics`. Any importable module path works as a workload too."""

FINISHED = ("ok", "oom")
"""Statuses that `resume` treats as done."""


def resolve_workload(workload: str) -> ModuleType:
    """The module of a registered workload name or of a module path."""
    try:
        return importlib.import_module(WORKLOADS.get(workload, workload))
    except ModuleNotFoundError:
        raise ValueError(
            f"unknown workload {workload!r}: choose one of {', '.join(WORKLOADS)}"
        ) from None


def identity_key(workload: str, spec: dict[str, Any], round_index: int = 0) -> str:
    """The key of a point by what it measures: a Spec's RUN_OPTIONS (timeouts, display options)
    are left out, so resuming with another --timeout does not run finished points again. Rounds
    after the first (see `run_sweep`) are points of their own; round 0 is the point itself."""
    try:
        options = set(getattr(resolve_workload(workload).Spec, "RUN_OPTIONS", ()))
    except (ValueError, AttributeError):
        options = set()
    measured = {key: value for key, value in spec.items() if key not in options}
    return point_key(workload, {**measured, "round": round_index} if round_index else measured)


def spec_fields(workload: str) -> list[str]:
    """Names of the spec fields of a workload, in declaration order."""
    return [field.name for field in dataclasses.fields(resolve_workload(workload).Spec)]


ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Failure|Interrupt):")


def failure_record(status: str, message: str) -> dict[str, Any]:
    """Metrics part of a failed point: its status and one line saying why.

    The line kept is the last one that names an exception (`RuntimeError: ...`: a chained
    error names its cause last), else the first line: never a stray line of detail that a
    multi-line message ends with.
    """
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if ERROR_LINE.match(ln)]
    line = named[-1] if named else (lines[0] if lines else "")
    return {"status": status, "error": line[:400] or status}


def spec_dict(spec: Any) -> dict[str, Any]:
    """A spec (dataclass or dict) as a plain dict."""
    return dataclasses.asdict(spec) if dataclasses.is_dataclass(spec) else dict(spec)


def run_in_process(workload: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one point here, turning its failure into a status (what the worker does)."""
    try:
        metrics = resolve_workload(workload).run_point(spec)
    except Exception as error:  # noqa: BLE001 - a failed point is a row, never a crash
        return failure_record(classify_failure(error), f"{type(error).__name__}: {error}")
    except SystemExit as error:  # the point's own code (a model, a factory) ended the process
        return failure_record("error", f"SystemExit: the point's code called sys.exit({error.code!r})")
    finally:
        release_device_memory()
    return {"status": "ok", "error": None, **metrics}


def classify_failure(error: BaseException) -> str:
    """'oom' for out-of-memory errors of any device, else 'error'."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return "oom"
    text = str(error).lower()
    return "oom" if "out of memory" in text or "can't allocate memory" in text else "error"


def run_sweep(
    workload: str,
    specs: Iterable[Any],
    *,
    out: Path,
    resume: bool = False,
    timeout_s: float = 900.0,
    isolate: bool = True,
    reuse_worker: bool = False,
    rounds: int = 1,
    only_round: int | None = None,
    on_start: Callable[[int, dict[str, Any]], bool | None] | None = None,
    on_done: Callable[[Record], None] | None = None,
) -> list[Record]:
    """Run every point not yet finished in `out`; return the records written by this call.

    `isolate` runs points in worker processes (False: in this process, for debugging).
    `reuse_worker` keeps one worker for consecutive points of a round (much faster for light
    points such as attention kernels); a worker that fails a point is replaced, and each round
    starts a fresh one, so that rounds stay the independent unit the intervals resample. Points
    that measure cold starts or process-wide memory keep the default, a fresh process per point.
    `rounds` runs the list that many times, interleaved (see the module docstring); `only_round`
    runs one of them, so points that cannot share one command (different models) are interleaved
    by calling once per round and command in turn. `on_start` runs before each pending point;
    when it returns False the point is skipped (no row: it stays pending for a later `resume`).
    """
    points = [spec_dict(spec) for spec in specs]
    done = _finished_keys(workload, points, out) if resume else set()
    written = []
    worker: PointWorker | None = None
    schedule = [(r, spec) for r in round_indices(rounds, only_round) for spec in points]
    try:
        for index, (round_index, spec) in enumerate(schedule):
            if identity_key(workload, spec, round_index) in done:
                continue
            if on_start and on_start(index, spec) is False:
                continue
            begin = timeit.default_timer()
            if not isolate:
                metrics = run_in_process(workload, spec)
            else:
                if worker is not None and index and schedule[index - 1][0] != round_index:
                    worker.close(kill=True)  # a round is one process: rounds vary independently
                    worker = None
                worker = worker if worker is not None and worker.alive else PointWorker(workload)
                metrics = worker.run(spec, timeout_s)
                if not reuse_worker or metrics.get("status") != "ok":
                    worker.close(kill=metrics.get("status") != "ok")
                    worker = None
            record = {**provenance(spec.get("device")), "workload": workload, **spec,
                      **({"round": round_index, "rounds": rounds} if rounds > 1 else {}), **metrics,
                      "wall_s": round(timeit.default_timer() - begin, 3)}
            append_record(out, record)
            written.append(record)
            if on_done:
                on_done(record)
    finally:
        if worker is not None:
            worker.close(kill=True)
    return written


def round_indices(rounds: int, only_round: int | None = None) -> list[int]:
    """The rounds a sweep runs: all of `rounds`, or `only_round` alone; ValueError for bad ones."""
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"--rounds must be a whole number of at least 1, got {rounds!r}")
    check_steps("rounds", rounds, 1, unit="rounds")  # and not more than any sweep could run
    if only_round is None:
        return list(range(rounds))
    if not isinstance(only_round, int) or isinstance(only_round, bool) or not 0 <= only_round < rounds:
        raise ValueError(f"--round must lie in 0..{rounds - 1} (a round of --rounds {rounds}), "
                         f"got {only_round!r}")
    return [only_round]


def record_spec(record: Record, template: Iterable[str], workload: str) -> dict[str, Any]:
    """The spec part of a record, by the keys of a spec of the same workload.

    A field added to the Spec after the record was written takes its default, so results files
    of an older lmscope still resume.
    """
    defaults = _spec_defaults(workload)
    return {key: record.get(key, defaults.get(key)) for key in template}


def _spec_defaults(workload: str) -> dict[str, Any]:
    try:
        spec_type = resolve_workload(workload).Spec
    except (ValueError, AttributeError):
        return {}
    return {
        field.name: field.default
        for field in dataclasses.fields(spec_type)
        if field.default is not dataclasses.MISSING
    }


def _finished_keys(workload: str, points: list[dict[str, Any]], out: Path) -> set[str]:
    """Keys of the points that already have an `ok` or `oom` record in `out`."""
    if not points or not out.exists():
        return set()
    return {
        identity_key(workload, record_spec(record, points[0], workload), record.get("round") or 0)
        for record in read_records(out)
        if record.get("status") in FINISHED and record.get("workload") == workload
    }


def pending_count(
    workload: str, specs: Iterable[Any], out: Path, resume: bool, rounds: int = 1,
    only_round: int | None = None,
) -> int:
    """How many of `specs` (times their rounds) a sweep would run (for progress bars)."""
    points = [spec_dict(spec) for spec in specs]
    done = _finished_keys(workload, points, out) if resume else set()
    return sum(identity_key(workload, p, r) not in done
               for r in round_indices(rounds, only_round) for p in points)
