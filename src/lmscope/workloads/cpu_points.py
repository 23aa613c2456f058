"""Points that cannot run on the CPU they would get, refused before a sweep starts.

lmscope's Triton FlashAttention (`--attention flash`) needs a CUDA GPU, or Triton's CPU
interpreter (TRITON_INTERPRET=1, the tests' way). Built in the worker, such a point only failed
there, as an error row with exit 1; the command line refuses it up front instead (exit 2), as it
refuses `--cuda-graph on` on the CPU. The fast path (`--fast on`) keeps its own refusal when built.
An explicit `--device cpu` is refused before torch is imported; `auto` asks torch for a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lmscope.envflags import env_flag
from lmscope.inputs.choices import FLASH_ON_CPU


def refuse_triton_attention_on_cpu(points: Iterable[Mapping[str, Any]]) -> None:
    """ValueError (one line) for the first point (its fields) that asks for `--attention flash`
    on the CPU."""
    if env_flag("TRITON_INTERPRET"):
        return
    for point in points:
        triton = point.get("attention") == "flash" and not point.get("fast", False)
        if triton and runs_on_cpu(str(point.get("device", "auto"))):
            raise ValueError(FLASH_ON_CPU)


def runs_on_cpu(device: str) -> bool:
    """Whether a point's --device puts it on the CPU: cpu, or auto on a machine without CUDA
    (the one case that imports torch)."""
    if device != "auto":
        return device == "cpu"
    import torch

    return not torch.cuda.is_available()
