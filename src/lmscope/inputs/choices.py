"""The spelled-out choices of a model point (model name, sizes, mode, precision, attention,
device, peer, CUDA graphs, checkpointing, ddp strategy), checked without importing torch.

The command line checks each value of its flags here before it imports a workload (torch alone
takes seconds to import), so a typo is refused at once; `ModelPointSpec` checks the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from lmscope.accounting.flops import MODES
from lmscope.accounting.treatments import check_policy_spelling
from lmscope.config import PRESETS
from lmscope.inputs.limits import check_size
from lmscope.parallel.strategies import check_strategy

PRECISIONS = ("fp32", "bf16", "fp16")
"""fp32: no autocast; bf16/fp16: torch.autocast over fp32 master weights."""

ATTENTION_BACKENDS = ("naive", "sdpa", "sdpa-cudnn", "flash", "flash-torch")
"""The attention backends a point may name (`lmscope.model.attention` registers these)."""
FLASH_ON_CPU = ("--attention flash runs lmscope's Triton kernels, which need a CUDA GPU: on the CPU "
                "use --attention flash-torch (the same FlashAttention-2 algorithm in PyTorch)")

PEERS = ("none", "hf", "liger")
"""Peers of a point's model: none; hf (a preset's sizes as transformers' Llama); liger (Liger-Kernel
applied to an hf: model)."""

CUDA_GRAPH_CHOICES = ("auto", "on", "off")
"""--cuda-graph: replay the step from CUDA graphs (auto: on with --fast on a GPU)."""

COMPILE_MODES = ("max-autotune-no-cudagraphs", "reduce-overhead")
"""torch.compile modes beside the default one (`--compile on`); see `lmscope.workloads.compile_mode`."""
COMPILE_SCOPES = ("model", "blocks")
"""What torch.compile compiles: the whole model as one graph, or each of its blocks."""

HF_PREFIX = "hf:"
"""--model hf:<model_type or config.json>: a transformers config with random weights."""

SOURCE_SPELLING = "a preset ({presets}), hf:<model_type or config.json>, or <module or file.py>:<factory>"


def source_kind(name: str) -> str:
    """preset | hf | factory, from the spelling of --model alone (nothing is imported)."""
    if not name.strip():
        raise ValueError("--model is empty: give " + SOURCE_SPELLING.format(presets="tiny, small, ..."))
    if name.startswith(HF_PREFIX):
        return "hf"
    return "factory" if ":" in name else "preset"


def check_model_name(name: Any) -> None:
    """Refuse a --model that is not a string, is empty, or is a preset name lmscope does not have."""
    if not isinstance(name, str):
        raise ValueError(f"--model takes a string, got {name!r}")
    if source_kind(name) == "preset" and name.lower() not in {p.lower() for p in PRESETS}:
        raise ValueError(f"unknown model size {name!r}: choose "
                         + SOURCE_SPELLING.format(presets=", ".join(PRESETS)))


def check_device_name(device: str) -> None:
    """Refuse a device lmscope does not know how to name (whether it is present is checked later)."""
    if not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
        raise ValueError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N")


def one_of(what: str, choices: Sequence[str], hint: str = "") -> Callable[[Any], None]:
    """A check that refuses a value outside `choices`, naming them (and `hint`)."""

    def check(value: Any) -> None:
        if value not in choices:
            raise ValueError(f"unknown {what} {value!r}: choose one of {', '.join(choices)}{hint}")

    return check


_compile_word = one_of("--compile value", ("off", "on", *COMPILE_MODES), " (a comma list sweeps them)")


def check_compile_value(value: Any) -> None:
    """A --compile value once on/off words became True/False: a bool, or a mode's name."""
    if not isinstance(value, bool):
        _compile_word(value)


CHECKS: dict[str, Callable[[Any], None]] = {
    "size": check_model_name,
    "context_length": partial(check_size, "context_length"),
    "batch_size": partial(check_size, "batch_size"),
    "mode": one_of("mode", MODES),
    "precision": one_of("precision", PRECISIONS),
    "attention": one_of("attention backend", ATTENTION_BACKENDS),
    "device": check_device_name,
    "peer": one_of("peer", PEERS, " (the torch.compile peer is --compile on, or a mode such as "
                                  "reduce-overhead)"),
    "cuda_graph": one_of("--cuda-graph", CUDA_GRAPH_CHOICES),
    "compile": check_compile_value,
    "compile_scope": one_of("--compile-scope", COMPILE_SCOPES),
    "checkpoint": check_policy_spelling,
    "strategy": check_strategy,
}
"""Spec field -> its torch-free check."""


def check_choices(values: dict[str, Any]) -> None:
    """Check each value of the fields `CHECKS` knows (a list is checked item by item)."""
    for name, value in values.items():
        if name in CHECKS:
            for item in value if isinstance(value, list) else [value]:
                CHECKS[name](item)
