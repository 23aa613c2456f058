"""torch.compile of a point's model: which mode, over which modules, and which first calls compile.

`--compile` takes `off`, `on` (torch's default mode), `max-autotune-no-cudagraphs` (Triton GEMM
templates and coordinate-descent tuning of every generated kernel, no CUDA graphs) and
`reduce-overhead` (the compiled forward and backward replayed from CUDA graphs, inductor's
cudagraph trees); a comma list sweeps them. A row's `compile` is false, true (the default mode)
or the mode's name, so rows written before the modes existed keep their meaning.

What is compiled: the model only, with static shapes (a point has one shape). The loss
(cross-entropy of the logits, eager) and the optimizer step stay outside: compiling an AdamW
step over every parameter tensor of a large model is a compile of its own, far slower than the
model's, and lmscope's peers all use torch's fused AdamW anyway. `--compile-scope model` (the
default) compiles the whole model as one graph; `blocks` compiles each of its repeated blocks
instead (torch's "regional compilation" recipe): the blocks are alike, so one compilation serves
all of them and the cold compile costs about one block, not the whole depth; what lies between
the blocks (embedding, final norm, LM head) runs eagerly. The blocks are the source's own
(`UserModel.blocks`), else the model's largest ModuleList.

reduce-overhead:
* needs a CUDA GPU (on a CPU torch would run the mode without graphs: a row named for what it
  did not do), and is refused with `--fast on` or `--cuda-graph on`, which bring CUDA graphs of
  their own;
* each step starts with `torch.compiler.cudagraph_mark_step_begin()`, so the previous step's
  graphs are a finished iteration and their outputs may be overwritten;
* the first step runs the compiled kernels without graphs (cudagraph trees' warm-up), the
  second records the graphs, later ones replay them: `compile_s` covers both (`FIRST_CALLS`).

Compilation happens in `TrainStep.compile_warmup`, after the FLOP count's eager step and before
the warm-up and the timed steps; `compile_s` is the time of those first compiled calls.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from lmscope.inputs.choices import COMPILE_MODES, COMPILE_SCOPES

MODES = COMPILE_MODES
CHOICES = ("off", "on", *MODES)
SCOPES = COMPILE_SCOPES
GRAPHED = "reduce-overhead"
"""The mode that replays CUDA graphs."""
WORDS = {"off": False, "on": True}
FIRST_CALLS = {GRAPHED: 2}
"""Steps that compile (and record graphs) before replays begin; 1 for the other modes."""


def compile_choice(value: bool | str) -> bool | str:
    """A --compile value as a row holds it: False (off), True (on) or a mode's name."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in MODES:
        return text
    if text in WORDS:
        return WORDS[text]
    raise ValueError(f"--compile takes {', '.join(CHOICES)} (a comma list sweeps them), got {value!r}")


def check_compile(spec: object) -> None:
    """Refuse a compile mode or scope this point cannot run, saying what to change."""
    choice, scope = spec.compile, spec.compile_scope  # type: ignore[attr-defined]
    if scope not in SCOPES:
        raise ValueError(f"unknown --compile-scope {scope!r}: choose one of {', '.join(SCOPES)}")
    if scope != "model" and not choice:
        raise ValueError("--compile-scope blocks says what torch.compile compiles: it needs --compile on "
                         "(or a mode); without --compile leave the scope at model")
    if choice == GRAPHED:
        device = spec.device  # type: ignore[attr-defined]
        if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
            raise ValueError("--compile reduce-overhead replays CUDA graphs, which need a CUDA GPU: on the "
                             "CPU use --compile on or max-autotune-no-cudagraphs")


def torch_mode(choice: bool | str) -> str | None:
    """The `mode` argument of torch.compile (None: torch's default mode)."""
    return choice if isinstance(choice, str) else None


def compiled_blocks(model: nn.Module, blocks: Sequence[nn.Module] | None) -> Sequence[nn.Module]:
    """The modules `--compile-scope blocks` compiles: the source's blocks, else the largest ModuleList."""
    if blocks:
        return blocks
    from lmscope.sources.hf import decoder_layers

    return decoder_layers(model)


def compile_model(
    model: nn.Module, choice: bool | str, scope: str, blocks: Sequence[nn.Module] | None = None
) -> nn.Module:
    """The module a step calls: torch.compile of the model, or the model with its blocks compiled.

    Compilation itself happens on the first call.
    """
    mode = torch_mode(choice)
    if scope == "model":
        return torch.compile(model, mode=mode, dynamic=False)
    for block in compiled_blocks(model, blocks):
        block.compile(mode=mode, dynamic=False)
    return model


def first_calls(choice: bool | str) -> int:
    """How many steps compile (and, for reduce-overhead, record) before the steady state."""
    return FIRST_CALLS.get(choice, 1) if isinstance(choice, str) else 1
