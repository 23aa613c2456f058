"""Records: one flat dict per measured point, appended to JSONL the moment it exists.

A record holds the point's spec fields, its metrics (keys carry units: `_ms`, `_gib`, `_gbps`,
`tflops`), `status` (`ok`, `oom`, `timeout`, `error`), `error` (one line or None) and the
provenance of `lmscope.records.provenance` (time, host and host id, GPU with its clocks, versions, the
source's git sha, CPU affinity and load), re-exported here: every row of every script is stamped
by `provenance()` or `stamp(row)`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmscope.records.provenance import provenance as provenance
from lmscope.records.provenance import stamp as stamp

Record = dict[str, Any]
STATUSES = ("ok", "oom", "timeout", "error")


def point_key(workload: str, spec: dict[str, Any]) -> str:
    """Stable identity of a point: the workload and its spec fields, sorted."""
    return json.dumps({"workload": workload, **spec}, sort_keys=True, default=str)


def append_record(path: Path, record: Record) -> None:
    """Append one record as a JSON line and flush it to disk at once.

    The line always starts a line of its own: after a line that a killed writer left without its
    end of line, a newline comes first, so the new row never merges into the torn one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, default=str) + "\n"
    with path.open("ab+") as handle:  # writes go to the end, wherever the last read left off
        size = handle.seek(0, os.SEEK_END)
        if size:
            handle.seek(size - 1)
            if handle.read(1) not in (b"\n", b"\r"):
                line = "\n" + line
        handle.write(line.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())


@dataclass(frozen=True)
class SkippedLine:
    """A line of a results file that holds no record, and why."""

    number: int
    """1-based line number."""
    reason: str


@dataclass(frozen=True)
class ResultsFile:
    """What a results file holds: its records, and the lines that are not records."""

    path: Path
    records: list[Record]
    skipped: list[SkippedLine]
    torn: bool
    """The last line was cut off (not JSON, no end of line): a writer killed mid-row."""

    def skipped_note(self, *, torn: bool = True) -> str | None:
        """One line naming the skipped lines (the first three) and why; None when none were.
        `torn=False` leaves a cut-off last line out (when it is said apart)."""
        skipped = self.skipped if torn or not self.torn else self.skipped[:-1]
        if not skipped:
            return None
        shown = ", ".join(f"line {s.number} ({s.reason})" for s in skipped[:3])
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        return f"{self.path}: skipped {len(skipped)} line(s) that hold no row: {shown}{more}"


TORN = "cut off: no end of line, as a writer killed mid-row leaves it"


def scan_results(path: Path) -> ResultsFile:
    """Read a JSONL results file: every JSON object is a record; other lines are skipped, each
    with its reason (blank lines silently). FileNotFoundError / ValueError for a missing path or
    a folder."""
    if not path.exists():
        raise FileNotFoundError(f"no results file at {path}: pass the results.jsonl of a run")
    if not path.is_file():
        raise ValueError(f"{path} is not a file: pass the results.jsonl of a run")
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.splitlines()
    records: list[Record] = []
    skipped: list[SkippedLine] = []
    torn = False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn = number == len(lines) and not text.endswith(("\n", "\r"))
            skipped.append(SkippedLine(number, TORN if torn else "not JSON"))
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            skipped.append(SkippedLine(number, f"a JSON {type(record).__name__}, not a row"))
    return ResultsFile(path, records, skipped, torn)


def read_records(path: Path) -> list[Record]:
    """All records of a JSONL file (lines that hold none are left out: see `scan_results`)."""
    return scan_results(path).records


def set_aside_torn_line(path: Path) -> Path | None:
    """Move a cut-off last line of `path` to `<path>.torn` (appended there, nothing lost), so the
    results file reads whole again; the path it went to, or None when the last line was whole."""
    if not scan_results(path).torn:
        return None
    data = path.read_bytes()
    cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    aside = path.with_name(path.name + ".torn")
    with aside.open("ab") as handle:
        handle.write(data[cut:] + b"\n")
    with path.open("r+b") as handle:
        handle.truncate(cut)
    return aside
