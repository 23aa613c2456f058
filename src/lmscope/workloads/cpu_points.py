"""Points that cannot run on the CPU they would get, refused before a sweep starts.

lmscope's Triton FlashAttention (`--attention flash`) needs a CUDA GPU, or Triton's CPU
interpreter (TRITON_INTERPRET=1, the tests' way). Built in the worker, such a point only failed
there, as an error row with exit 1; the command line refuses it up front instead (exit 2), as it
refuses `--cuda-graph on` on the CPU. The fast path (`--fast on`) keeps its own refusal when built.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from lmscope.envflags import env_flag
from lmscope.sources.preset import FLASH_ON_CPU


def refuse_triton_attention_on_cpu(specs: Iterable[Any]) -> None:
    """ValueError (one line) for the first point that asks for `--attention flash` on the CPU."""
    if env_flag("TRITON_INTERPRET"):
        return
    for spec in specs:
        triton = getattr(spec, "attention", None) == "flash" and not getattr(spec, "fast", False)
        if triton and runs_on_cpu(str(getattr(spec, "device", "auto"))):
            raise ValueError(FLASH_ON_CPU)


def runs_on_cpu(device: str) -> bool:
    """Whether a point's --device puts it on the CPU: cpu, or auto on a machine without CUDA."""
    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())
