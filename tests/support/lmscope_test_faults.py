"""A test-only workload that fails on purpose: ok, oom, raise, crash, hang.

The runner tests point the worker processes at it (PYTHONPATH) to check that each failure costs
one point only.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch


@dataclass(frozen=True, kw_only=True)
class Spec:
    """What the point does, and a value to square when it succeeds."""

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("pid_file",)

    behaviour: str = "ok"
    value: int = 0
    pid_file: str = ""


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    spec = Spec(**point)
    if spec.pid_file:
        Path(spec.pid_file).write_text(str(os.getpid()))
    if spec.behaviour == "oom":
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    if spec.behaviour == "raise":
        raise RuntimeError("the first line says why\n  a detail\n\"")
    if spec.behaviour == "crash":
        print("fatal: simulated crash", flush=True)
        sys.stdout.flush()
        os._exit(3)
    if spec.behaviour == "hang":
        time.sleep(3600)
    return {"value_squared": spec.value**2, "worker_pid": os.getpid()}
