"""Run a child process against a budget of CPU seconds instead of a wall-clock timeout.

On a loaded machine a child gets a share of a core: its wall time grows with the load, the work
it does (its CPU time) does not. A fixed wall-clock timeout then fails a test that was only slowed
down (a Triton-interpreter child once hit its 600 s on a busy 2-core machine). Here a child is
stopped when it has used more CPU than its work needs (a runaway), or none at all for a while
(a hang: a lock, a pipe, a peer that died), and never for being slow.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class ChildStopped(AssertionError):
    """The child was killed for running past its budget or for hanging; says which, with its output."""


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a live process (with its children it has waited for); None where
    /proc does not tell (not Linux, or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name: field 3 (state) onwards
    utime_to_cstime = fields[11:15]  # stat fields 14-17
    return sum(int(f) for f in utime_to_cstime) / os.sysconf("SC_CLK_TCK")


def run_with_cpu_budget(
    command: Sequence[str],
    *,
    cpu_budget_s: float,
    stall_s: float,
    env: Mapping[str, str] | None = None,
    poll_s: float = 0.5,
) -> subprocess.CompletedProcess[str]:
    """Run `command` to its end with its output captured, however long the load makes it.

    ChildStopped when it has used more than `cpu_budget_s` CPU seconds, or no CPU for `stall_s`
    wall seconds. Where the CPU time cannot be read, wall time stands in for it (a plain timeout).
    """
    started = time.monotonic()
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as child:
        used, progressed = 0.0, started
        while True:
            try:
                out, err = child.communicate(timeout=poll_s)
                return subprocess.CompletedProcess(command, child.returncode, out, err)
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            reading = cpu_seconds(child.pid)
            current = now - started if reading is None else reading
            if current > used:
                used, progressed = current, now
            if used > cpu_budget_s:
                why = f"used {used:.0f} CPU seconds, past its budget of {cpu_budget_s:.0f}"
            elif now - progressed > stall_s:
                why = f"used no CPU for {now - progressed:.0f} s: it hangs"
            else:
                continue
            child.kill()
            out, err = child.communicate()
            raise ChildStopped(f"{' '.join(command)}: {why}\n{out[-4000:]}{err[-2000:]}")
