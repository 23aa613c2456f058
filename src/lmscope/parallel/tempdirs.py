"""Temporary folders of worker and rank processes that a `kill -9` cannot leave behind for good.

Each folder's name carries the pid of the process that made it (`lmscope-worker-<pid>-xxxx`).
A process killed with SIGKILL cannot remove its folder, so every new one first removes the
folders of its prefix whose owner is no longer running.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path


def owned_tempdir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A TemporaryDirectory named `<prefix><pid>-...`, after removing stale ones of `prefix`."""
    remove_stale(prefix)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}-")


def remove_stale(prefix: str, root: str | None = None) -> list[Path]:
    """Remove the `<prefix><pid>-*` folders under `root` (the temp dir) whose pid is not running."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{prefix}*"):
        match = pattern.match(path.name)
        if match and path.is_dir() and not pid_running(int(match.group(1))):
            with contextlib.suppress(OSError):
                shutil.rmtree(path)
                removed.append(path)
    return removed


def pid_running(pid: int) -> bool:
    """Whether a process with this pid runs (one of another user counts; a zombie, dead but not
    yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"
