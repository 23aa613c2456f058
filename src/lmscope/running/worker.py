"""The worker process of a sweep: `python -m lmscope.running.worker WORKLOAD READY_FILE`.

Reads requests `{"spec": {...}, "result": "/path"}` one per line on stdin until end of input;
runs each point with `run_in_process` (a Python exception becomes an `oom`/`error` status) and
writes the result JSON to a temporary name, then renames it, so the parent never reads half a file.
A crash that kills the interpreter leaves no result; the parent records that point as an error.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from pathlib import Path

from lmscope.running.runner import resolve_workload, run_in_process


def die_with_parent() -> None:
    """Ask Linux to kill this worker when the sweep process that started it dies, whatever way."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)


def serve(workload: str, ready_file: str) -> int:
    """Import the workload, mark ready, then answer requests from stdin until it closes."""
    die_with_parent()
    try:
        resolve_workload(workload)
    finally:
        Path(ready_file).touch()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        result = run_in_process(workload, request["spec"])
        partial = request["result"] + ".partial"
        with open(partial, "w") as handle:
            json.dump(result, handle, default=str)
        os.replace(partial, request["result"])
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], sys.argv[2]))
