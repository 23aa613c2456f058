"""`lmscope study`: choose the run directory, plan, show the plan, run it, show what happened."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from lmscope.report import console
from lmscope.study.execute import plan_table, run_plan, summary_table
from lmscope.study.planner import make_plan, parse_budget
from lmscope.study.sections import build_sections
from lmscope.study.target import Target, detect


def run_dir_for(out: Path | None, resume: bool, runs: Path = Path("runs")) -> Path:
    """--out, else with --resume the newest runs/study-*, else a new runs/study-<time>."""
    if out is not None:
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file: give the study's folder, e.g. runs/study-1")
        return out
    if resume:
        earlier = sorted(runs.glob("study-*"))
        if earlier:
            return earlier[-1]
    return runs / ("study-" + dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S"))


def study(
    *,
    budget: str,
    out: Path | None,
    resume: bool,
    device: str,
    plan_only: bool,
    target: Target | None = None,
    timeout_s: float | None = None,
) -> int:
    """Plan and (unless `plan_only`) run the study; the exit code (1 when a section failed)."""
    budget_s = parse_budget(budget)
    run_dir = run_dir_for(out, resume)
    target = target or detect(device)
    plan = make_plan(build_sections(target, run_dir), target, budget_s, run_dir, resume)
    console.say(
        f"study on {target.device_name} ({target.device_type}, {target.gpus} GPU(s)), "
        f"budget {budget_s / 60:.1f} min -> {run_dir}"
    )
    console.show_table(plan_table(plan), title=f"plan: {plan.run_s / 60:.1f} min estimated now "
                       f"({plan.pace.describe()})")
    if plan_only:
        return 0
    manifest = run_plan(plan, run_dir, timeout_s=timeout_s)
    console.show_table(summary_table(manifest), title="study")
    if manifest.get("beyond_plan"):
        console.say(f"time was left after the plan: ran {manifest['beyond_plan']} of its later points too")
    if manifest.get("stopped"):
        console.say(manifest["stopped"])
    console.say(f"report: lmscope report {run_dir} -o {run_dir / 'report.html'}")
    return 1 if any(s.get("state") == "failed" for s in manifest["sections"].values()) else 0
