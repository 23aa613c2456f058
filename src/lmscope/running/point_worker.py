"""The parent's handle on a worker process that runs sweep points (`python -m lmscope.running.worker`).

The worker imports its workload first and then marks itself ready; a point's timeout counts
from then, so a slow `import torch` never turns into a timeout. It reads one request per line
on stdin and writes each point's result to the file the request names (written whole, then
renamed). The parent waits for that file with a deadline: a worker that dies leaves no file and
the point becomes an `error` row with the end of the worker's output; one that runs past the
deadline is killed with its process group and the point becomes a `timeout` row. Either way
the next point gets a fresh worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lmscope.parallel.tempdirs import owned_tempdir

POLL_S = 0.05
STARTUP_TIMEOUT_S = 300.0
"""How long a new worker may take to import its workload (torch, CUDA libraries)."""


class PointWorker:
    """One worker process; `run(spec)` returns the point's metrics or its failure record."""

    def __init__(self, workload: str) -> None:
        self._tmp = owned_tempdir("lmscope-worker-")
        self._dir = Path(self._tmp.name)
        self._log_path = self._dir / "log"
        self._log = self._log_path.open("w")
        self._count = 0
        self._ready = self._dir / "ready"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lmscope.running.worker", workload, str(self._ready)],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True, text=True,
        )

    @property
    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.process.poll() is None

    def run(self, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Run one point; never raises for the point's own failure (KeyboardInterrupt does)."""
        self._count += 1
        result_path = self._dir / f"result-{self._count}.json"
        log_offset = self._log_path.stat().st_size
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({"spec": spec, "result": str(result_path)}) + "\n")
            self.process.stdin.flush()
            startup_deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while not self._ready.exists() and self.alive and time.monotonic() < startup_deadline:
                time.sleep(POLL_S)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if result_path.exists():
                    return json.loads(result_path.read_text())
                if not self.alive:
                    return self._crashed(log_offset)
                time.sleep(POLL_S)
        except BrokenPipeError:
            return self._crashed(log_offset)
        except BaseException:
            self.close(kill=True)
            raise
        self.close(kill=True)
        return {"status": "timeout", "error": f"no result within {timeout_s:g} s"}

    def _crashed(self, log_offset: int) -> dict[str, Any]:
        self.process.wait()
        with self._log_path.open(errors="replace") as log:
            log.seek(log_offset)
            tail = log.read()[-4000:]
        lines = [line.strip() for line in tail.splitlines() if line.strip()]
        reason = lines[-1] if lines else "no output"
        message = f"worker exited with code {self.process.returncode}: {reason}"
        return {"status": "error", "error": message[:400]}

    def close(self, kill: bool = False) -> None:
        """Stop the worker (end of input, or SIGKILL to its whole process group)."""
        if self.alive and not kill and self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill = True
        if kill:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._log.close()
        self._tmp.cleanup()
