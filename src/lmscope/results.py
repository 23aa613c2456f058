"""Records: one flat dict per measured point, appended to JSONL the moment it exists.

A record holds the point's spec fields, its metrics (keys carry units: `_ms`, `_gib`, `_gbps`,
`tflops`), `status` (`ok`, `oom`, `timeout`, `error`), `error` (one line or None) and the
provenance of DESIGN.md: time, host, device, driver, torch/triton versions, git sha.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

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


@cache
def _git_sha() -> str | None:
    """The checkout's commit ('-dirty' when files differ from it), or LMSCOPE_GIT_SHA for copies
    of a tree without .git."""
    if os.environ.get("LMSCOPE_GIT_SHA"):
        return os.environ["LMSCOPE_GIT_SHA"]
    here = Path(__file__).parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, cwd=here).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha}-dirty" if sha and dirty else sha or None


@cache
def _gpu_inventory() -> tuple[str | None, str | None]:
    """(device name, driver version) from nvidia-smi, without initializing CUDA here."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    first = out.stdout.strip().splitlines()[:1]
    if out.returncode or not first:
        return None, None
    name, _, driver = first[0].partition(",")
    return name.strip(), driver.strip()


def provenance() -> Record:
    """Where and with what a record was produced."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu_name, driver = _gpu_inventory()
    return {
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "device_name": gpu_name or platform.processor() or platform.machine(),
        "driver": driver,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_sha": _git_sha(),
    }
