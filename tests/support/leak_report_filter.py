"""Drop the leak report that Triton's nanobind bindings print as a test process exits.

Compiling a Gluon kernel without a GPU leaves MLIR objects in Triton's caches; at interpreter
exit libtriton's nanobind lists each of them as "leaked" on stderr, lines below pytest's summary
that bury it. nanobind can only be told to stay quiet from inside the extension
(`nb::set_leak_warnings`), and it prints from C after every Python exit handler has run. So from
the last of those on, the process's stderr goes through `grep`, which drops nanobind's lines and
passes every other line on.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys

NANOBIND_LINES = (r"^nanobind: |^ - leaked (instance|type|function) |^ - \.\.\. skipped remainder"
                  r"|^See https://nanobind\.readthedocs\.io/en/latest/refleaks\.html")
"""The lines of nanobind's leak report (its last line ends without a newline)."""


_FILTERS: list[subprocess.Popen[bytes]] = []
"""The running filter (held so that it is not collected before the process ends)."""


def filter_leak_report_at_exit() -> None:
    """From the process's Python exit handlers on (pytest has restored its streams by then, and
    nanobind prints later still), route file descriptor 2 through a filter of nanobind's lines."""
    atexit.register(_route_stderr_through_filter)


def _route_stderr_through_filter() -> None:
    """fd 2 -> grep -v nanobind's lines -> the old fd 2 (left as it is where grep is missing)."""
    grep = shutil.which("grep")
    if grep is None or _FILTERS:
        return
    sys.stderr.flush()
    stderr = os.dup(2)
    try:
        filter_ = subprocess.Popen([grep, "-v", "-E", NANOBIND_LINES], stdin=subprocess.PIPE,
                                   stdout=stderr, stderr=stderr)
    finally:
        os.close(stderr)
    assert filter_.stdin is not None
    os.dup2(filter_.stdin.fileno(), 2)
    filter_.stdin.close()  # fd 2 keeps the pipe open; the filter ends when the process does
    _FILTERS.append(filter_)
