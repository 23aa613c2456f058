"""Records: one flat dict per measured point, appended to JSONL the moment it exists.

A record holds the point's spec fields, its metrics (keys carry units: `_ms`, `_gib`, `_gbps`,
`tflops`), `status` (`ok`, `oom`, `timeout`, `error`), `error` (one line or None) and the
provenance of `lmscope.provenance` (time, host and host id, GPU with its clocks, versions, the
source's git sha, CPU affinity and load), re-exported here: every row of every script is stamped
by `provenance()` or `stamp(row)`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lmscope.provenance import provenance as provenance
from lmscope.provenance import stamp as stamp

Record = dict[str, Any]
STATUSES = ("ok", "oom", "timeout", "error")


def point_key(workload: str, spec: dict[str, Any]) -> str:
    """Stable identity of a point: the workload and its spec fields, sorted."""
    return json.dumps({"workload": workload, **spec}, sort_keys=True, default=str)


def append_record(path: Path, record: Record) -> None:
    """Append one record as a JSON line and flush it to disk at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, default=str) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def read_records(path: Path) -> list[Record]:
    """All records of a JSONL file; a torn last line (a killed writer) and non-objects are skipped."""
    if not path.exists():
        raise FileNotFoundError(f"no results file at {path}: pass the results.jsonl of a run")
    if not path.is_file():
        raise ValueError(f"{path} is not a file: pass the results.jsonl of a run")
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
