"""What a command accepts as a results file, before it reads or appends one.

* Reading (`table`, `report`): a file must hold lmscope rows (JSON objects with a `workload`);
  an empty, plain-text, garbage or foreign file (`{"a": 1}`) is refused in one line. Lines that
  hold no row are reported (`notes`), never dropped without a word.
* Appending (`bench`, `profile`, `memory`, ... with `--out`): the file must hold no rows of
  another command, which the refusal names; a last line cut off by a killed writer is moved to
  `<out>.torn`, so the file reads whole again, and the user is told.

Nothing here prints: callers say the notes through `lmscope.report.console`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lmscope.records.results import Record, ResultsFile, scan_results, set_aside_torn_line

STUDY_WORKLOADS = "lmscope.study."
"""Prefix of the workloads that only `lmscope study` runs (its accounting and precision points)."""


@dataclass(frozen=True)
class Rows:
    """The lmscope rows of a results file and what was left out of them, one note a line."""

    records: list[Record]
    notes: list[str]


def read_rows(path: Path) -> Rows:
    """The rows of a results file that lmscope wrote; ValueError (one line) when it holds none."""
    scanned = scan_results(path)
    rows = [r for r in scanned.records if r.get("workload")]
    foreign = len(scanned.records) - len(rows)
    if not rows:
        raise ValueError(_no_rows(scanned, foreign))
    notes = [note] if (note := scanned.skipped_note()) else []
    if foreign:
        notes.append(f"{path}: left out {foreign} JSON object(s) without a workload field (not lmscope rows)")
    return Rows(rows, notes)


def _no_rows(scanned: ResultsFile, foreign: int) -> str:
    path, fix = scanned.path, "pass the results.jsonl of an lmscope run"
    if foreign:
        return (f"{path} holds no lmscope rows: its {foreign} JSON object(s) have no workload field "
                f"(not written by lmscope): {fix}")
    if scanned.skipped:
        first = scanned.skipped[0]
        return (f"{path} holds no lmscope rows: none of its {len(scanned.skipped)} line(s) is a JSON row "
                f"(line {first.number}: {first.reason}): {fix}")
    return f"{path} is empty: {fix}"


def prepare_out(workload: str, out: Path) -> list[str]:
    """Check an existing --out before `workload` appends to it; the notes to say.

    ValueError when it holds rows of another command, or lines none of which is a row (a file
    that is not a results file); a cut-off last line is set aside (`set_aside_torn_line`).
    """
    if not out.is_file() or out.stat().st_size == 0:
        return []
    scanned = scan_results(out)
    others = list(dict.fromkeys(str(r.get("workload") or "") for r in scanned.records
                                if r.get("workload") != workload))
    if others:
        raise ValueError(f"--out {out} holds rows of {writer_of(others[0])}, not of lmscope {workload}: "
                         f"give this run its own --out (or resume the command that wrote it)")
    if scanned.skipped and not scanned.records and not scanned.torn:
        first = scanned.skipped[0]
        raise ValueError(f"--out {out} is not a results file (line {first.number}: {first.reason}): "
                         "give another --out")
    notes = [note] if (note := scanned.skipped_note(torn=False)) else []
    aside = set_aside_torn_line(out)
    if aside is not None:
        notes.append(f"{out}: moved its cut-off last line (a run killed while writing it) to {aside}; "
                     "the file reads whole again")
    return notes


def writer_of(workload: str) -> str:
    """Which lmscope command (or API) writes rows of `workload`, as a user would name it."""
    if not workload:
        return "another program (rows without a workload field)"
    if workload.startswith(STUDY_WORKLOADS):
        return "lmscope study"
    if workload == "probe":
        return "the Probe API (lmscope.probe)"
    return f"lmscope {workload}"
