"""The fused forwards `lmscope.model.hf_fast.apply_to_hf_model` binds to transformers' modules.

Each is bound to its module instance (``module.forward = MethodType(...)``), reads the module's
parameters when it runs (so wrappers that swap them, FSDP, keep working) and computes the module's
math in the compute dtype: autocast's where autocast is on (then autocast itself is switched off
inside: every cast is explicit), else the weights' dtype. Block matmuls go through
`master_linear` (weight gradients in the weights' dtype straight from the matmul; the FastPatch's
bf16 copies when turned on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmscope.kernels.fused_cross_entropy import fused_linear_cross_entropy
from lmscope.kernels.rmsnorm import rmsnorm
from lmscope.kernels.rope import rope_qkv
from lmscope.kernels.swiglu import swiglu
from lmscope.model.attention import get_attention
from lmscope.model.fast_transformer import compute_dtype, master_linear
from lmscope.model.hf_fast import sliding_window

IGNORE_INDEX = -100
"""transformers' label for tokens without a loss (padding, the position after the last)."""


@dataclass
class Context:
    """What a patched attention or MLP needs besides its module: the patch (bf16 weight copies,
    attention backend) and the indices of its matmul groups there."""

    patch: Any
    groups: tuple[int, ...]

    def project(self, x: torch.Tensor, slot: int, dtype: torch.dtype) -> torch.Tensor:
        """x @ [W_a; W_b; ...].T (+ the biases) for the module's matmul `slot`, in `dtype`."""
        index = self.groups[slot]
        layers = self.patch.linears(index)
        weights = tuple(layer.weight for layer in layers)
        y = master_linear(x, *weights, stacked=self.patch.stack(index, weights, dtype))
        if any(layer.bias is not None for layer in layers):
            y = y + torch.cat([layer.bias if layer.bias is not None
                               else layer.weight.new_zeros(layer.out_features) for layer in layers]).to(dtype)
        return y


def _dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The compute dtype: autocast's when on, else the weights'."""
    return compute_dtype(x.device, weight.dtype)


def norm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """RMSNorm in one kernel; the output in the autocast dtype (else as transformers promotes)."""
    weight = self.weight
    dtype = compute_dtype(hidden_states.device, torch.promote_types(weight.dtype, hidden_states.dtype))
    return rmsnorm(hidden_states, weight, self.variance_epsilon, out_dtype=dtype)


def mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)): one matmul for gate and up, the SwiGLU kernel, down."""
    context: Context = self._lmscope_fast_context
    dtype = _dtype(x, self.down_proj.weight)
    with torch.autocast(x.device.type, enabled=False):
        gate_up = context.project(x.to(dtype), 0, dtype)
        return context.project(swiglu(gate_up), 1, dtype)


def attention_forward(
    self: nn.Module, hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    attention_mask: torch.Tensor | None = None, past_key_values: Any = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """Causal self-attention: one [q; k; v] matmul, RoPE (key/value heads repeated to the query
    heads), lmscope's FlashAttention, the output projection; (output, None) as transformers'."""
    context: Context = self._lmscope_fast_context
    cache = past_key_values if past_key_values is not None else kwargs.get("past_key_value")
    batch, seq, _ = hidden_states.shape
    _check_inputs(self, attention_mask, cache, seq, position_embeddings)
    cos, sin = position_embeddings
    head_dim = self.head_dim
    heads, kv = self.q_proj.out_features // head_dim, self.k_proj.out_features // head_dim
    dtype = _dtype(hidden_states, self.q_proj.weight)
    with torch.autocast(hidden_states.device.type, enabled=False):
        qkv = context.project(hidden_states.to(dtype), 0, dtype)
        half = head_dim // 2
        q, k, v = rope_qkv(qkv, cos[..., :half], sin[..., :half], heads, kv_heads=kv, halves=True)
        out = get_attention(context.patch.attention)(q, k, v).transpose(1, 2).reshape(batch, seq, -1)
        out = context.project(out, 1, dtype)
    if cache is not None:  # the first forward of a cache: store the key/value heads
        cache.update(k[:, :: heads // kv], v[:, :: heads // kv], self.layer_idx)
    return out, None


def base_forward(self: nn.Module, input_ids: Any = None, attention_mask: torch.Tensor | None = None,
                 *args: Any, **kwargs: Any) -> Any:  # fmt: skip
    """The decoder stack's own forward after refusing a padding mask: with lmscope's attention
    implementation transformers drops the mask before the layers, so it is checked here."""
    _check_unpadded(attention_mask)
    return type(self).forward(self, input_ids, attention_mask, *args, **kwargs)


def _check_unpadded(mask: torch.Tensor | None) -> None:
    """Refuse a mask that hides tokens (an all-ones one costs one host synchronization)."""
    if mask is None:
        return
    if mask.ndim != 2:
        raise ValueError(f"lmscope's fast attention takes no {mask.ndim}-D attention mask (it is causal "
                         "over whole rows): pass a 2-D one of all ones, or none")
    if not bool(mask.all()):
        raise ValueError("lmscope's fast attention is causal over whole rows: pass no padding mask "
                         "(attention_mask=None or all ones)")


def _check_inputs(module: nn.Module, mask: torch.Tensor | None, cache: Any, seq: int,
                  position_embeddings: Any) -> None:  # fmt: skip
    """Refuse what causal attention over whole rows would get wrong (one line each)."""
    _check_unpadded(mask)
    if position_embeddings is None:
        raise ValueError("the fast attention takes the model's (cos, sin) position_embeddings: "
                         "this transformers does not pass them (use transformers >= 4.50)")
    if position_embeddings[0].shape[-1] != module.head_dim:
        raise ValueError(f"rotary tables of width {position_embeddings[0].shape[-1]} for head_dim "
                         f"{module.head_dim}: partial rotary embeddings are not supported")
    if cache is not None and cache.get_seq_length(module.layer_idx) > 0:
        raise ValueError("the fast path is for training: decoding with a KV cache is not supported "
                         "(generate with an unpatched model)")
    window = sliding_window(module)
    if window is not None and seq > window:
        raise ValueError(f"a sequence of {seq} tokens is longer than the sliding window {window}, "
                         "which lmscope's attention does not have: shorten the context or set "
                         "config.sliding_window = None")


def lm_head_forward(self: nn.Linear, hidden_states: torch.Tensor, targets: torch.Tensor | None = None,
                    num_items_in_batch: Any = None) -> torch.Tensor:  # fmt: skip
    """The logits, or given `targets` (-100: ignored) the fused LM head + cross-entropy: the mean
    over the kept tokens, or their sum / num_items_in_batch (transformers' gradient accumulation)."""
    if targets is None:
        return nn.Linear.forward(self, hidden_states)
    weight = self.weight
    dtype = _dtype(hidden_states, weight)
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1]).to(dtype)
    targets = targets.reshape(-1).to(hidden.device)
    with torch.autocast(hidden.device.type, enabled=False):
        loss = fused_linear_cross_entropy(hidden, weight, targets, ignore_index=IGNORE_INDEX,
                                          reduction="mean" if num_items_in_batch is None else "sum")
    if num_items_in_batch is None:
        return loss
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def causal_lm_forward(
    self: nn.Module, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None, past_key_values: Any = None,
    inputs_embeds: torch.Tensor | None = None, labels: torch.Tensor | None = None,
    use_cache: bool | None = None, logits_to_keep: int | torch.Tensor = 0, **kwargs: Any,
) -> Any:  # fmt: skip
    """transformers' causal-LM forward; with `labels` (or `shift_labels`) the loss comes from the
    fused LM head + cross-entropy and `logits` is None (the full logits are never made)."""
    shift_labels = kwargs.pop("shift_labels", None)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  past_key_values=past_key_values, inputs_embeds=inputs_embeds)
    if labels is None and shift_labels is None:
        original = type(self).forward
        return original(self, **inputs, use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
    num_items_in_batch = kwargs.pop("num_items_in_batch", None)
    return_dict = kwargs.pop("return_dict", None)
    outputs = getattr(self, self.base_model_prefix)(**inputs, use_cache=bool(use_cache), **kwargs)
    if shift_labels is None:  # position t predicts token t + 1; the last position predicts nothing
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    loss = self.lm_head(outputs[0], shift_labels, num_items_in_batch)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    extras = {name: getattr(outputs, name, None)
              for name in ("past_key_values", "hidden_states", "attentions")}
    result = CausalLMOutputWithPast(loss=loss, logits=None, **extras)
    return result.to_tuple() if return_dict is False else result
