"""Glue of `lmscope comm` and `lmscope ddp`: run the sweep, then plot or summarize, and exit status.

`comm` writes the busbw-vs-size plot beside the results. `ddp` adds the single-GPU baseline
to the grid and, after the sweep, prints the tables of `report.ddp_tables` (each strategy against
its baselines with the overhead model's line, sharded memory, profiled steps), each point's rounds
pooled.
Both return the exit code of `exit_status` (a failed rank is an error row naming the rank). Under torchrun
every rank runs the sweep; ranks other than 0 write `<results>.rank<R>.jsonl`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmscope.cli.sweep import default_out, exit_status, run_and_report
from lmscope.parallel.launch import torchrun_env
from lmscope.report import console
from lmscope.report.comm_plots import plot_busbw
from lmscope.report.ddp_tables import ddp_summary, fsdp_summary, overhead_model_line, profile_summary
from lmscope.report.rounds import pool_rounds
from lmscope.report.tables import Table, render
from lmscope.running.runner import spec_fields

STARTUP_MARGIN_S = 120.0
"""Seconds the runner allows a point beyond the ranks' own timeout (imports, process start)."""


def results_path(out: Path | None) -> Path:
    """The results file of this process (rank R > 0 of a torchrun job: `<out>.rank<R>.jsonl`)."""
    out = out or default_out()
    env = torchrun_env()
    if env is None or env["rank"] == 0:
        return out
    return out.with_name(f"{out.stem}.rank{env['rank']}{out.suffix}")


def run_comm(specs: Sequence[Any], *, out: Path | None, resume: bool, timeout_s: float,
             fmt: str | None) -> int:
    """Run the collective sweep, show the table, write the busbw plot; the exit code."""
    out = results_path(out)
    records = run_and_report("comm", specs, out=out, resume=resume,
                             timeout_s=timeout_s + STARTUP_MARGIN_S, fmt=fmt, title="lmscope comm",
                             reuse_worker=True)
    png = plot_busbw(records, out.with_suffix(".busbw.png"))
    if png is not None:
        console.say(f"wrote {png}")
    return exit_status(records)


def run_ddp(specs: Sequence[Any], *, out: Path | None, resume: bool, timeout_s: float,
            fmt: str | None, rounds: int = 1) -> int:
    """Run the ddp sweep, show its table and the summaries (sharded memory, profiles, against the
    baseline and the model; each point's rounds pooled); the exit code."""
    out = results_path(out)
    records = run_and_report("ddp", specs, out=out, resume=resume,
                             timeout_s=timeout_s + STARTUP_MARGIN_S, fmt=fmt, title="lmscope ddp",
                             reuse_worker=True, rounds=rounds)
    pooled = pool_rounds(records, spec_fields("ddp"))
    _show(fsdp_summary(pooled), "fully sharded: memory per rank (max over ranks, rank 0) and bytes per "
          "step beside the FSDP accounting", out.with_suffix(".fsdp.md") if fmt == "md" else None)
    _show(profile_summary(pooled), "profiled steps per rank (mean over ranks): ms per step",
          out.with_suffix(".profile.md") if fmt == "md" else None)
    model_line = overhead_model_line(pooled)
    _show(ddp_summary(pooled), "against the single-GPU step and the overhead model",
          out.with_suffix(".summary.md") if fmt == "md" else None, model_line)
    return exit_status(records)


def _show(table: Table, title: str, path: Path | None, line: str | None = None) -> None:
    """Print a summary table (and a line under it) when it has rows; write both to `path` as md."""
    if not table[1]:
        return
    console.show_table(table, title=title)
    if line:
        console.say(line)
    if path is not None:
        path.write_text(render(table, "md") + (f"\n{line}\n" if line else ""))
        console.say(f"wrote {path}")
