"""Run a test file's Triton kernels in Triton's CPU interpreter, in a child pytest.

TRITON_INTERPRET must be set before Triton decorates a kernel, and another test module of the
same pytest process may already have imported the kernels without it. So on a machine without
CUDA each kernel test file has one parent test that reruns the whole file in a child pytest
started with TRITON_INTERPRET=1 (marked by LMSCOPE_TRITON_CHILD=1); its kernel tests skip in the
parent and run in the child. With CUDA everything runs in the one process, compiled.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from types import ModuleType

import pytest
import torch
from cpu_budget import run_with_cpu_budget

CPU_BUDGET_S = 900.0
"""CPU seconds a child may use: several times what the largest kernel test file needs, yet a
bound on a runaway. A loaded machine makes a child slower, not costlier, so the bound is on CPU
time, not on wall time (see cpu_budget)."""
STALL_S = 300.0
"""Wall seconds a child may go without using any CPU before it counts as hung."""

CHILD_NEEDED = not torch.cuda.is_available() and os.environ.get("LMSCOPE_TRITON_CHILD") != "1"
"""True in a CPU-only process that was not started as the interpreter child."""


def rerun_in_interpreter(test_file: str) -> None:
    """The parent test: run `test_file` in a TRITON_INTERPRET=1 child and require it to pass."""
    if not CHILD_NEEDED:
        pytest.skip("the kernels run in this process")
    child = run_interpreted(["-m", "pytest", "-q", "-p", "no:cacheprovider", test_file])
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    assert " passed" in child.stdout


def run_interpreted(args: list[str]) -> subprocess.CompletedProcess[str]:
    """`python *args` with TRITON_INTERPRET=1 (marked as the child), within a child's CPU budget."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "LMSCOPE_TRITON_CHILD": "1"}
    return run_with_cpu_budget([sys.executable, *args], env=env, cpu_budget_s=CPU_BUDGET_S,
                               stall_s=STALL_S)


def skip_in_parent(parent_test: str) -> None:
    """Skip a kernel test in the parent process; it runs in the child started by `parent_test`."""
    if CHILD_NEEDED:
        pytest.skip(f"runs in the TRITON_INTERPRET=1 child ({parent_test})")


def module_under_test(name: str, parent_test: str) -> ModuleType:
    """Import `name` for a kernel test: skipped in the parent, run in the child of `parent_test`.

    The import happens here, after the skip, so the parent never decorates the kernels without
    TRITON_INTERPRET.
    """
    skip_in_parent(parent_test)
    return importlib.import_module(name)
