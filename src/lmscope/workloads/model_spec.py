"""The spec fields shared by every workload that runs a model's training step (bench, profile,
memory, ddp). `size` names the model source (--model; --size is its alias): a preset, hf:<model_type
or config.json>, or <module or file.py>:<factory> (see `lmscope.sources`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from lmscope.config import ModelConfig
from lmscope.inputs.choices import check_choices, check_device_name, source_kind
from lmscope.inputs.limits import check_size
from lmscope.sources import ModelRequest, ModelSource, resolve_source
from lmscope.workloads.compile_mode import check_compile, compile_choice


@dataclass(frozen=True, kw_only=True)
class ModelPointSpec:
    """One model, batch, mode and precision to run: the identity of a measured point."""

    size: str = "tiny"
    """The model source (--model): a preset (tiny, small, medium, large, xl, 2.7B), hf:<model_type or
    config.json>, or <module or file.py>:<factory>; the fields below override its sizes."""
    vocab_size: int | None = None
    """Override of the preset's vocabulary size."""
    d_model: int | None = None
    """Override of the preset's d_model."""
    d_ff: int | None = None
    """Override of the preset's d_ff."""
    num_layers: int | None = None
    """Override of the preset's number of layers."""
    num_heads: int | None = None
    """Override of the preset's number of heads."""
    model_context_length: int | None = None
    """The model's context_length; defaults to context_length."""
    context_length: int = 128
    """Tokens per sequence in the batch."""
    batch_size: int = 4
    """Sequences per batch."""
    mode: str = "train-step"
    """forward | forward-backward | train-step."""
    precision: str = "fp32"
    """fp32 | bf16 | fp16 (autocast)."""
    attention: str = "naive"
    """Attention backend: naive | sdpa | sdpa-cudnn | flash | flash-torch."""
    compile: bool | str = False
    """torch.compile of the model: False (off), True (torch's default mode), max-autotune-no-cudagraphs
    or reduce-overhead (`lmscope.workloads.compile_mode`; compile time reported apart from the steps)."""
    compile_scope: str = "model"
    """What torch.compile compiles: model (the whole model) | blocks (each block, regional)."""
    fast: bool = False
    """Run lmscope's fused fast path (FastTransformerLM: Triton kernels, fused LM head + loss; for hf:
    Llama, Qwen2 and Mistral the same kernels on the transformers model, lmscope.model.hf_fast)."""
    optimizer_in_backward: bool = False
    """Fast path: update each weight during the backward, on a side stream, as soon as its
    gradient is ready (FusedAdamW(step_in_backward=True)) instead of in a separate phase."""
    device: str = "auto"
    """'auto' (cuda when present, else cpu), 'cuda', 'cuda:N' or 'cpu'."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "compile", compile_choice(self.compile))  # "on"/"off" as True/False
        check_compile(self)
        check_choices({name: getattr(self, name) for name in
                       ("size", "context_length", "batch_size", "mode", "precision", "attention")})
        if self.fast and source_kind(self.size) == "factory":
            raise ValueError(f"--fast on runs lmscope's presets and transformers' Llama, Qwen2 and Mistral "
                             f"(hf:...), not {self.size}: drop --fast")
        if self.fast and self.attention == "naive":
            raise ValueError("--fast on needs a fused attention: pass --attention flash (or sdpa)")
        if self.fast and self.compile:
            raise ValueError("--fast on does not run under torch.compile (it replays CUDA graphs "
                             "instead, --cuda-graph): drop --compile on (torch.compile's own CUDA "
                             "graphs are a peer of their own: --compile reduce-overhead without --fast)")
        if self.optimizer_in_backward and not (
            self.fast and self.precision == "bf16" and self.mode == "train-step"
        ):
            raise ValueError("--optimizer-in-backward on is lmscope's FusedAdamW stepping inside the "
                             "backward: it needs --fast on --precision bf16 --mode train-step")
        if self.model_context_length is not None:
            check_size("model_context_length", self.model_context_length)
        check_device(self.device)
        source = self.source()
        limit = source.context_limit
        if source.unit == "tokens" and limit is not None and self.context_length > limit:
            raise ValueError(
                f"context length {self.context_length} exceeds the model's context_length "
                f"{limit}: raise --model-context-length or shorten --context-length"
            )

    def source(self) -> ModelSource:
        """The point's model source, resolved (once per process)."""
        return resolve_source(ModelRequest.of(self))

    def model_config(self) -> ModelConfig | None:
        """The reference model's ModelConfig for a preset (analytic FLOPs, memory); None otherwise."""
        return self.source().config


def model_slug(name: str) -> str:
    """--model as a folder-name part: a preset as is, paths and colons made safe."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_.") or "model"


def check_device(device: str) -> None:
    """Refuse a device name lmscope cannot use here (a CUDA device on a machine without one)."""
    check_device_name(device)
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device} was asked for but no CUDA GPU is visible: use --device cpu")
        index = device.partition(":")[2]
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise ValueError(
                f"--device {device}: this machine has CUDA devices 0..{torch.cuda.device_count() - 1}"
            )
