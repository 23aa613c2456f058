"""Faster versions of a transformers model (hf:): lmscope's fast path (--fast on) or Liger-Kernel
(--peer liger), applied to the model the hf source built, with the same batch and loss.

``--fast on`` runs `lmscope.model.hf_fast.apply_to_hf_model` on a Llama, Qwen2 or Mistral causal
LM (or any model of their module classes) with lmscope's FusedAdamW, which keeps the bf16 weight
copies current; the step is CUDA-graph capturable (``--cuda-graph auto``). ``--peer liger`` calls
Liger-Kernel's ``apply_liger_kernel_to_<model_type>(model=...)`` on the same model: its RMSNorm,
SwiGLU, RoPE and fused linear cross-entropy, attention as ``--attention`` says. Both take the loss
through the model's own ``shift_labels`` path (targets as given, no shift, as the eager step's
cross-entropy of the logits), so neither builds the full logits. The checks run at resolution,
on the meta-device model; each refusal is one line.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

import torch
from torch import nn

from lmscope.model.hf_families import FAMILIES, supported_families
from lmscope.model.hf_fast import ATTENTIONS, plan_fast_patch, sliding_window
from lmscope.sources.contract import UserModel
from lmscope.sources.request import ModelRequest

LIGER = "liger"
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_speedup(request: ModelRequest, model_type: str, meta_model: nn.Module) -> dict[str, Any]:
    """Refuse a --fast / --peer the model cannot run; the facts its rows carry (fast_replaced)."""
    if request.fast:
        return {"fast_replaced": _check_fast(request, meta_model)}
    if request.peer == LIGER:
        if model_type not in FAMILIES:
            raise ValueError(f"--peer liger runs Liger-Kernel's patches for {supported_families()}, not "
                             f"{model_type} ({request.name})")
        if importlib.util.find_spec("liger_kernel") is None:
            raise ValueError("--peer liger needs Liger-Kernel: pip install liger-kernel")
        return {}
    if request.peer != "none":
        raise ValueError(f"--peer {request.peer} is a peer of lmscope's presets; {request.name} is itself a "
                         "transformers model: drop --peer (or use --peer liger)")
    return {}


def _check_fast(request: ModelRequest, model: nn.Module) -> str:
    if request.attention not in ATTENTIONS:
        raise ValueError(f"--fast on with {request.name} runs lmscope's attention backends: pass --attention "
                         f"{', '.join(ATTENTIONS)}")
    if request.optimizer_in_backward:
        raise ValueError(f"--optimizer-in-backward on runs with lmscope's presets: drop it for "
                         f"{request.name}")
    try:
        plan = plan_fast_patch(model, request.attention)
    except ValueError as error:
        raise ValueError(f"--fast on with {request.name}: {error}") from None
    if "causal_lm" not in plan.replaced:
        raise ValueError(f"--fast on with {request.name}: {type(model).__name__} is not a causal LM of "
                         f"{supported_families()}, whose fused LM head + loss the fast step needs")
    for name in plan.replaced.get("attention", ()):
        window = sliding_window(model.get_submodule(name))
        if window is not None and request.context_length > window:
            raise ValueError(f"--fast on with {request.name}: its sliding window {window} is shorter than "
                             f"the context {request.context_length}, and lmscope's attention has none: "
                             "shorten --context-length")
    return plan.summary()


def speedup_user_model(model: nn.Module, model_type: str, request: ModelRequest,
                       make_batch: Any, device: torch.device, blocks: Any) -> UserModel:  # fmt: skip
    """The UserModel of the fast path or the Liger peer around the built model."""
    if request.fast:
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("--fast on runs lmscope's Triton kernels, which need a CUDA GPU: on the CPU "
                             "drop --fast")
        if device.type != "cuda" and request.attention == "sdpa-cudnn":
            raise ValueError("--attention sdpa-cudnn is cuDNN's kernel, which needs a CUDA GPU: on the CPU "
                             "use --attention flash-torch")
        from lmscope.model.hf_fast import apply_to_hf_model

        patch = apply_to_hf_model(model, attention=request.attention)
        shadow_dtype = AUTOCAST_DTYPES.get(request.precision)
        optimizer = lambda _: patch.fused_adamw(lr=1e-4, shadow_dtype=shadow_dtype)  # noqa: E731
    else:
        module = importlib.import_module("liger_kernel.transformers")
        getattr(module, f"apply_liger_kernel_to_{model_type}")(model=model)
        optimizer = None
    return UserModel(model=model, make_batch=make_batch, loss=shifted_labels_loss, forward=logits,
                     optimizer=optimizer, unit="tokens", blocks=blocks)


def shifted_labels_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The model's own loss of the targets as given (``shift_labels``): fused, no logits built."""
    inputs, targets = batch
    return model(input_ids=inputs, shift_labels=targets).loss


def logits(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The logits (--mode forward)."""
    return model(input_ids=batch[0]).logits
