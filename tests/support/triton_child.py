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

CHILD_NEEDED = not torch.cuda.is_available() and os.environ.get("LMSCOPE_TRITON_CHILD") != "1"
"""True in a CPU-only process that was not started as the interpreter child."""


def rerun_in_interpreter(test_file: str) -> None:
    """The parent test: run `test_file` in a TRITON_INTERPRET=1 child and require it to pass."""
    if not CHILD_NEEDED:
        pytest.skip("the kernels run in this process")
    env = {**os.environ, "TRITON_INTERPRET": "1", "LMSCOPE_TRITON_CHILD": "1"}
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
                           env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
    assert " passed" in child.stdout


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
