"""lmscope's FlashAttention kernels as transformers attention implementations (AttentionInterface).

``--attention flash`` runs a transformers model with lmscope's Triton FlashAttention-2 and
``flash-torch`` with its tiled PyTorch version, registered under names without "flash" in them
(transformers treats those as its own flash-attn packages). The kernels compute causal softmax
attention with scale 1/sqrt(head_dim) and no dropout, without padding masks: a model whose
layers are not causal, use another scale or drop attention weights is refused. Grouped-query
key/value heads are repeated to the query heads before the kernel.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

IMPLEMENTATIONS = {"flash": "lmscope_fa2", "flash-torch": "lmscope_fa2_torch",
                   "sdpa-cudnn": "lmscope_sdpa_cudnn"}
"""lmscope's --attention -> the attn_implementation name it is registered under (sdpa-cudnn: torch's
SDPA pinned to cuDNN's kernel, CUDA only)."""
FAST_IMPLEMENTATIONS = {**IMPLEMENTATIONS, "sdpa": "lmscope_sdpa"}
"""The names a model patched by lmscope.model.hf_fast gets (transformers builds no mask for any of
them); --attention sdpa of an unpatched hf: model stays transformers' own SDPA."""
DROPOUT_FIELDS = ("attention_dropout", "attn_pdrop")


def register(transformers: Any) -> None:
    """Register the implementations with transformers (idempotent; a no-op before 4.50)."""
    if not hasattr(transformers, "AttentionInterface"):
        return
    for backend, name in FAST_IMPLEMENTATIONS.items():
        transformers.AttentionInterface.register(name, _attention(backend))


def check_config(config: Any, source: str, backend: str) -> None:
    """Refuse a config whose attention the kernels cannot compute (dropout on attention weights)."""
    for field in DROPOUT_FIELDS:
        if float(getattr(config, field, 0.0) or 0.0) > 0:
            raise ValueError(f"{source}: its {field} is {getattr(config, field)}, and lmscope's "
                             f"--attention {backend} has no dropout: use --attention sdpa")


def _attention(backend: str) -> Any:
    def forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                **kwargs: Any) -> tuple[torch.Tensor, None]:
        """(batch, heads, seq, d) in, (batch, seq, heads, d) out, as transformers expects."""
        del attention_mask, kwargs  # causal and unpadded: the kernel masks by position
        head_dim = query.shape[-1]
        if dropout and module.training:
            raise ValueError(f"--attention {backend} has no attention dropout: use --attention sdpa")
        if not getattr(module, "is_causal", True):
            raise ValueError(f"--attention {backend} is causal; {type(module).__name__} is not")
        if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-6):
            raise ValueError(f"--attention {backend} scales by 1/sqrt(head_dim); "
                             f"{type(module).__name__} uses {scaling}: use --attention sdpa")
        if key.shape[1] != query.shape[1]:  # grouped-query attention
            repeat = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
        # transformers applies RoPE in fp32 under autocast, so q and k may arrive in fp32 beside a
        # bf16 v: the kernels take one dtype, the autocast one (what SDPA would compute in)
        kind = query.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else value.dtype
        query, key, value = (t.to(dtype) for t in (query, key, value))
        from lmscope.model.attention import get_attention

        return get_attention(backend)(query, key, value).transpose(1, 2), None

    return forward
