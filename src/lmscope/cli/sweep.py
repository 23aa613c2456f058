"""Glue shared by the CLI commands: run a sweep with a progress bar, then show and save its table.

Every measuring command ends in `run_and_report`; `exit_status` turns its rows into the exit code.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmscope.envflags import env_flag
from lmscope.inputs.limits import check_timeout
from lmscope.records.results import Record, read_records
from lmscope.records.results_check import prepare_out, read_rows
from lmscope.report import console
from lmscope.report.compare import find_base
from lmscope.report.host_bound import host_bound_note
from lmscope.report.tables import FORMATS, build_table, render
from lmscope.running.runner import (
    identity_key,
    pending_count,
    record_spec,
    round_indices,
    run_sweep,
    spec_dict,
    spec_fields,
)
from lmscope.workloads.cpu_points import refuse_triton_attention_on_cpu

PLAN_ONLY = "LMSCOPE_PLAN_ONLY"
"""When set (1), a command that runs points checks its flags, prints the points it would run and
exits 0, running and writing nothing: how tests/test_doc_commands.py checks every documented command."""

EXIT_RULE = "0 when every point is ok or oom, 1 when any point is an error or a timeout"


def exit_status(records: Sequence[Record]) -> int:
    """The exit code of a command that ran points: 0 when every point is `ok` or `oom`, else 1.

    An `oom` row is an answer (this size does not fit on this device), as the study tables
    show it; an `error` or a `timeout` means something did not run as asked. Interrupts exit
    with 130 and bad input with 2 before anything runs.
    """
    return 0 if all(r.get("status") in ("ok", "oom") for r in records) else 1


def default_out() -> Path:
    """runs/<UTC timestamp>/results.jsonl."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / stamp / "results.jsonl"


def check_format(fmt: str | None) -> None:
    """Reject an unknown --format before anything runs."""
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS[1:])}")


def run_and_report(
    workload: str,
    specs: Sequence[Any],
    *,
    out: Path | None,
    resume: bool,
    timeout_s: float,
    fmt: str | None = None,
    compare: str | None = None,
    title: str | None = None,
    reuse_worker: bool = False,
    compare_base: str | None = None,
    rounds: int = 1,
    only_round: int | None = None,
) -> list[Record]:
    """Run the points (isolated, resumable, with progress), then print and save the table."""
    check_format(fmt)
    refuse_triton_attention_on_cpu(spec_dict(s) for s in specs)
    check_compare(compare, specs, compare_base)
    round_indices(rounds, only_round)
    check_timeout(timeout_s)
    if env_flag(PLAN_ONLY):
        show_plan(workload, specs)
        raise SystemExit(0)
    out = out or default_out()
    if resume and not out.exists():
        console.say(f"--resume: {out} does not exist yet; starting a new results file")
    check_writable(out)
    for note in prepare_out(workload, out):
        console.warn(note)
    for note in adjusted_sources(specs):
        console.say(note)
    todo = pending_count(workload, specs, out, resume, rounds, only_round)
    each = (f", round {only_round} of {rounds}" if only_round is not None
            else f" x {rounds} rounds" if rounds > 1 else "")
    console.say(f"{len(specs)} point(s){each}, {todo} to run -> {out}")
    with console.sweep_progress(todo, workload, [spec_dict(s) for s in specs]) as (on_start, on_done):
        run_sweep(workload, specs, out=out, resume=resume, timeout_s=timeout_s,
                  reuse_worker=reuse_worker, rounds=rounds, only_round=only_round, on_start=on_start,
                  on_done=on_done)
    spec_keys = spec_fields(workload)
    keys = {identity_key(workload, spec_dict(s)) for s in specs}
    records = [r for r in read_records(out) if r.get("workload") == workload
               and identity_key(workload, record_spec(r, spec_keys, workload)) in keys]
    show(records, spec_keys, fmt=fmt, compare=compare, out=out, title=title, compare_base=compare_base)
    return records


def show_plan(workload: str, specs: Sequence[Any]) -> None:
    """Under LMSCOPE_PLAN_ONLY: how many points, then each point's spec as one JSON line."""
    console.say(f"{PLAN_ONLY}: {len(specs)} {workload} point(s) planned, none run")
    for spec in specs:
        line = json.dumps(spec_dict(spec), default=str, sort_keys=True)
        console.console.print(line, markup=False, highlight=False, soft_wrap=True)


def adjusted_sources(specs: Sequence[Any]) -> list[str]:
    """One line per model source whose config moved fields with the size overrides (its rows
    carry the same as overrides_adjusted): the user learns before the run what will be built."""
    notes = []
    for spec in specs:
        source = spec.source() if callable(getattr(spec, "source", None)) else None
        if source is not None and source.adjusted:
            notes.append(f"{source.name}: adjusted with the overrides: {'; '.join(source.adjusted)}")
    return list(dict.fromkeys(notes))


def read_table_rows(path: Path) -> list[Record]:
    """The lmscope rows of a results file for `table`, saying what was left out (ValueError: none)."""
    rows = read_rows(path)
    for note in rows.notes:
        console.warn(note)
    return rows.records


def check_compare(compare: str | None, specs: Sequence[Any], compare_base: str | None = None) -> None:
    """Reject `--compare FIELD` before anything runs unless FIELD takes several values (and a
    `--compare-base` that is not one of them)."""
    if compare is None:
        if compare_base is not None:
            raise ValueError("--compare-base chooses the base of --compare: pass --compare FIELD too")
        return
    points = [spec_dict(s) for s in specs]
    varying = [k for k in points[0] if len({json.dumps(p.get(k), default=str) for p in points}) > 1]
    if compare not in varying:
        raise ValueError(
            f"cannot compare by {compare!r}: give it several values (e.g. --{compare.replace('_', '-')} "
            f"a,b); swept here: {', '.join(varying) or 'nothing'}"
        )
    if compare_base is not None:
        find_base([p.get(compare) for p in points], compare_base, compare)


def check_writable(out: Path) -> None:
    """Refuse an --out that is a folder or cannot be written, before anything runs."""
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder: give a file path such as {out / 'results.jsonl'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a"):
            pass
    except OSError as error:
        raise ValueError(f"cannot write --out {out}: {error.strerror or error}") from None


def show(
    records: Sequence[Record],
    spec_keys: Sequence[str],
    *,
    fmt: str | None,
    compare: str | None,
    out: Path | None,
    title: str | None = None,
    compare_base: str | None = None,
) -> None:
    """Print the table; with `fmt`, also write it beside the results file (or print it)."""
    table = build_table(records, spec_keys, compare=compare, compare_base=compare_base)
    console.show_table(table, title=title)
    note = host_bound_note(records, spec_keys)
    if note:
        console.say(note)
    if fmt and fmt != "table":
        text = render(table, fmt)
        if out is None:
            console.console.print(text, markup=False, highlight=False, soft_wrap=True)
        else:
            suffix = {"md": "md", "csv": "csv", "latex": "tex", "json": "table.json"}[fmt]
            path = out.with_suffix(f".{suffix}")
            path.write_text(text)
            console.say(f"wrote {path}")
