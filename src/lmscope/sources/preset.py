"""The preset source: lmscope's Transformer LM family (eager, fused fast path, or HF Llama peer).

Random token ids and targets from the vocabulary; the loss is cross-entropy in fp32 (the fast
model computes it fused, from its own forward); --checkpoint wraps the eager model's blocks.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmscope.config import ModelConfig, preset
from lmscope.inputs.choices import FLASH_ON_CPU, check_model_name
from lmscope.sources.contract import ModelSource, UserModel
from lmscope.sources.request import ModelRequest

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def preset_source(request: ModelRequest) -> ModelSource:
    """The source of a preset name with the request's overrides (ValueError for unknown names)."""
    check_model_name(request.name)
    if request.peer == "liger":
        raise ValueError("--peer liger applies Liger-Kernel to a transformers model: use --model hf:llama, "
                         "hf:qwen2 or hf:mistral")
    config = preset(request.name, **request.overrides(), context_length=request.context_length)
    own = request.peer == "none"  # lmscope's eager or fast model: its blocks may be checkpointed
    return ModelSource(
        name=request.name, kind="preset", unit="tokens", config=config,
        build=lambda device: _build(request, config, device),
        blocks=config.num_layers if own else None,
        has_optimizer=request.fast and request.precision != "fp32",
        context_limit=config.context_length,
    )


def token_batch(vocab_size: int) -> Any:
    """make_batch of a language model: random (inputs, targets) token ids of (batch, context)."""

    def make_batch(batch_size: int, context_length: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        shape = (batch_size, context_length)
        return (torch.randint(0, vocab_size, shape, device=device),
                torch.randint(0, vocab_size, shape, device=device))

    return make_batch


def logits_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy in fp32 of model(inputs) logits against the targets."""
    inputs, targets = batch
    return F.cross_entropy(model(inputs).float().flatten(0, 1), targets.flatten())


def _fused_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return model(*batch)  # FastTransformerLM(inputs, targets): the fused LM head + loss


def _logits(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return model(batch[0])


def _build(request: ModelRequest, config: ModelConfig, device: torch.device) -> UserModel:
    with device:  # build and initialize the weights on the device itself
        model = _model(request, config, device)
    blocks = model.layers if request.peer == "none" else None
    optimizer = None
    if request.fast and request.precision != "fp32":
        optimizer = lambda m: _fused_adamw(m, request)  # noqa: E731
    return UserModel(model=model, make_batch=token_batch(config.vocab_size),
                     loss=_fused_loss if request.fast else logits_loss, forward=_logits,
                     optimizer=optimizer, unit="tokens", blocks=blocks)


def _model(request: ModelRequest, config: ModelConfig, device: torch.device) -> nn.Module:
    """Eager TransformerLM, FastTransformerLM (fast) or HF's Llama (peer hf)."""
    if request.peer == "hf":
        from lmscope.model.hf_peer import HFLlamaPeer

        return HFLlamaPeer(config)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # the tests' CPU interpreter
    if request.attention == "sdpa-cudnn" and device.type != "cuda":
        raise ValueError("--attention sdpa-cudnn is cuDNN's kernel, which needs a CUDA GPU: "
                         "on the CPU use --attention sdpa")
    if request.fast:
        if device.type != "cuda" and not interpreted:
            raise ValueError("--fast on runs lmscope's Triton kernels, which need a CUDA GPU: "
                             "on the CPU drop --fast (or time --attention flash-torch)")
        from lmscope.model.fast_transformer import FastTransformerLM

        return FastTransformerLM(config, attention=request.attention)
    if request.attention == "flash" and device.type != "cuda" and not interpreted:
        raise ValueError(FLASH_ON_CPU)
    from lmscope.model.transformer import TransformerLM

    return TransformerLM(config, attention=request.attention)


def _fused_adamw(model: nn.Module, request: ModelRequest) -> torch.optim.Optimizer:
    """lmscope's FusedAdamW for the fast path in bf16/fp16: it also writes the model's bf16 weight
    copies and, with optimizer_in_backward, updates each weight inside the backward."""
    from lmscope.kernels.adamw import FusedAdamW

    model.shadow_weights(AUTOCAST_DTYPES[request.precision])  # turns the bf16 copies on
    optimizer = FusedAdamW(model.parameters(), lr=1e-4, shadows=model.current_shadows,
                           step_in_backward=request.optimizer_in_backward)
    if request.optimizer_in_backward:  # the block matmuls hand their bf16 weight gradients over
        model.update_weights_in_backward(optimizer)
    return optimizer
