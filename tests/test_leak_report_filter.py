"""Nothing but pytest's own lines below its summary: nanobind's leak report is dropped at exit."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SUPPORT = Path(__file__).parent / "support"

EXIT_LINES = """
import atexit, os, sys
sys.path.insert(0, sys.argv[1])
from leak_report_filter import filter_leak_report_at_exit
atexit.register(os.write, 2, b'nanobind: leaked 2 instances!\\n - leaked instance 0x1 of type "a.B"\\n'
                b' - leaked type "a.B"\\n - ... skipped remainder\\nkept line\\nnanobind: this is '
                b'likely caused by a reference counting issue in the binding code.\\n'
                b'See https://nanobind.readthedocs.io/en/latest/refleaks.html')
filter_leak_report_at_exit()  # exit handlers run last first: the filter is in place before the lines
print("out")
"""


def test_the_filter_drops_nanobinds_lines_and_keeps_the_others():
    done = subprocess.run([sys.executable, "-c", EXIT_LINES, str(SUPPORT)], capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "kept line\n")


def test_a_pytest_run_that_builds_a_gluon_kernel_ends_without_the_leak_report(tmp_path):
    # Triton keeps the MLIR objects that nanobind reports only when it compiles (an empty cache,
    # as on a fresh CI machine), not when it finds the kernel in its cache
    test = Path(__file__).parent / "kernels" / "test_flash_sm90.py"
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton-cache")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test), "-k",
                           "compiles_for_sm90_without_a_gpu and forward-64"], capture_output=True,
                          text=True, timeout=600, env=env)
    if "1 skipped" in done.stdout:
        pytest.skip("this Triton has no Gluon: nothing is built, nothing leaks")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:]
    assert "nanobind" not in done.stdout + done.stderr, done.stderr[-2000:]
