"""The reference Transformer LM run through lmscope's fused kernels: the same model, faster.

`FastTransformerLM` subclasses `TransformerLM`, so its parameters have the same names, shapes and
initialization and ``load_state_dict`` works both ways; only the forward differs:

* RMSNorm, SwiGLU and RoPE are Triton kernels (``lmscope.kernels.rmsnorm``, ``.swiglu``,
  ``.rope``), each residual add fused into the RMSNorm after it (``add_rmsnorm``, forward and
  backward); Q, K, V come from one matmul against [Wq; Wk; Wv] and the two SwiGLU inputs from one
  matmul against [w1; w3], and the RoPE kernel turns the packed projections straight into the
  per-head q, k, v that attention reads;
* every weight matmul (``master_linear``) hands its weight gradient back in the master weights'
  dtype straight from cuBLAS (fp32 out of bf16 inputs), so no bf16 -> fp32 cast kernels run; or,
  wired to an optimizer that steps in the backward (``update_weights_in_backward``), hands it to
  that optimizer in bf16 instead (autocast's rounding; no fp32 ``.grad``);
* under autocast the block weights are read from persistent bf16 copies (``shadow_weights``,
  stacked as the matmuls read them) instead of being cast every step; ``FusedAdamW`` writes
  those copies in the same pass as the update, and any other in-place change is noticed through
  autograd's version counters and copied again;
* attention is a registered backend (``flash``, lmscope's Triton FlashAttention, for the fast
  path; ``sdpa`` works too);
* given targets, the LM head and the cross-entropy are fused by chunks of tokens
  (``lmscope.kernels.fused_cross_entropy``), so the full fp32 logits never exist.

Precision: the parameters are the fp32 master weights; under ``torch.autocast`` the model reads
each block weight in the autocast dtype (its persistent copy; the embedding, norms and LM head are
cast where used) and runs every matmul and kernel in it with autocast itself switched off. The
residual stream stays fp32, as in the eager model under autocast. Without autocast everything
runs in the parameters' dtype.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from lmscope.config import ModelConfig
from lmscope.kernels.fused_cross_entropy import fused_linear_cross_entropy
from lmscope.kernels.rmsnorm import add_rmsnorm, rmsnorm
from lmscope.kernels.rope import rope_qkv
from lmscope.kernels.swiglu import swiglu
from lmscope.model.attention import get_attention
from lmscope.model.saved_tensors import rebuild_in_backward, recording_recipes
from lmscope.model.shadow_weights import ShadowWeights
from lmscope.model.transformer import TransformerBlock, TransformerLM


def compute_dtype(device: torch.device, default: torch.dtype) -> torch.dtype:
    """The autocast dtype when autocast is on for `device`, else `default`."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return default


WeightUpdate = Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], bool]
"""(weights, their gradients) -> whether the update took them (FusedAdamW.update_with_gradients)."""

_WIDE_MM: dict[str, bool] = {}  # device type -> whether torch.mm(..., out_dtype=) exists there


def _wide_mm_supported(device: torch.device) -> bool:
    """Whether this device's torch has bf16 x bf16 -> fp32 mm (CUDA, torch >= 2.8): probed once."""
    if device.type not in _WIDE_MM:
        a = torch.zeros(2, 2, dtype=torch.bfloat16, device=device)
        try:
            torch.mm(a, a, out_dtype=torch.float32)
            _WIDE_MM[device.type] = True
        except (TypeError, RuntimeError, NotImplementedError):  # no such overload or backend
            _WIDE_MM[device.type] = False
    return _WIDE_MM[device.type]


def matmul_into(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b (2-D) returned in `dtype`; bf16/fp16 inputs write fp32 from the matmul itself.

    On CUDA, torch >= 2.8 lets cuBLAS write its fp32 accumulators out directly (``out_dtype``),
    which saves a rounding to bf16 and a separate cast kernel. Elsewhere: matmul, then cast.
    """
    if a.dtype == dtype:
        return a @ b
    if dtype == torch.float32 and _wide_mm_supported(a.device):
        return torch.mm(a, b, out_dtype=dtype)
    return (a @ b).to(dtype)


class _MasterLinear(torch.autograd.Function):
    """x @ cat(weights).T in x's dtype over master weights of another dtype (fp32).

    The weights are stacked and cast in one copy per weight; the weight gradient of the stacked
    matmul comes out in the masters' dtype and is handed back as per-weight views (no casts).
    Given an `update` and weights that all need a gradient, with x in bf16 (or the masters'
    dtype), the gradient is computed in x's dtype and offered to `update` instead; if taken,
    autograd gets none for the weights.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, stacked: torch.Tensor | None, update: WeightUpdate | None,
                *weights: torch.Tensor) -> torch.Tensor:  # fmt: skip
        rows = [w.shape[0] for w in weights]
        if stacked is not None:  # a current copy of the stack in x's dtype (ShadowWeights)
            w = stacked
        elif len(weights) == 1 and weights[0].dtype == x.dtype:
            w = weights[0]
        else:
            w = torch.empty(sum(rows), *weights[0].shape[1:], dtype=x.dtype, device=x.device)
            for part, master in zip(w.split(rows), weights, strict=True):
                part.copy_(master)
        ctx.save_for_backward(x, w)
        ctx.rows = rows
        ctx.master_dtype = weights[0].dtype
        ctx.update, ctx.weights = (update, weights) if update is not None else (None, ())
        return F.linear(x, w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, w = ctx.saved_tensors
        dx = grad @ w if ctx.needs_input_grad[0] else None
        flat_grad, flat_x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        hand_over = (ctx.update is not None and all(ctx.needs_input_grad[3:])
                     and x.dtype in (torch.bfloat16, ctx.master_dtype))  # no fp16 overflow risk
        if hand_over:  # in x's dtype, as autocast's eager matmul rounds it, not an fp32 .grad
            dw = flat_grad.t() @ flat_x
            if ctx.update(ctx.weights, dw.split(ctx.rows)):
                return (dx, None, None, *[None] * len(ctx.rows))
        dw = matmul_into(flat_grad.t(), flat_x, ctx.master_dtype)
        return (dx, None, None, *dw.split(ctx.rows))


def master_linear(
    x: torch.Tensor, *weights: torch.Tensor, stacked: torch.Tensor | None = None,
    update: WeightUpdate | None = None,
) -> torch.Tensor:  # fmt: skip
    """F.linear(x, cat(weights)) computed in x's dtype; weight gradients in the weights' dtype.

    `stacked`, when given, is cat(weights) already in x's dtype (it is used instead of casting).
    `update`, when given, is offered the weight gradients in x's dtype during the backward
    (``FusedAdamW.update_with_gradients``); if it takes them, autograd gets none for the weights.
    """
    return _MasterLinear.apply(x, stacked, update, *weights)


_MATMULS_PER_BLOCK = 4  # [Wq; Wk; Wv], Wo, [w1; w3], w2

# model -> the optimizer its block matmuls hand their weight gradients to (update_weights_in_backward)
_WEIGHT_UPDATES: weakref.WeakKeyDictionary[torch.nn.Module, weakref.ref] = weakref.WeakKeyDictionary()


class FastTransformerBlock(TransformerBlock):
    """A `TransformerBlock` run by the fused kernels (called as a module, so hooks and
    activation checkpointing apply to it): forward(x, pending, ...) -> (x, pending).

    Under selective recompute (`lmscope.model.saved_tensors`) its norm outputs, SwiGLU's output and
    the attention output's (batch, seq, d_model) copy are saved as recipes: rebuilt in the backward
    from the residual, the SwiGLU input and the attention output, which stay saved."""

    rebuilds_cheap_tensors = True
    """Selective recompute of this block uses its recipes, not torch's selective checkpointing."""

    def __init__(self, config: ModelConfig, rope: torch.nn.Module, attention: str) -> None:
        super().__init__(config, rope, attention)
        self._attend = get_attention(attention)

    def forward(
        self, x: torch.Tensor, pending: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
        dtype: torch.dtype, stacks: list[torch.Tensor | None], update: WeightUpdate | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """One block over the fp32 residual stream, in the compute dtype.

        Takes the residual without the previous block's FFN output (`pending`) and returns it
        without this block's: each residual add runs inside the following RMSNorm (add_rmsnorm).
        """
        attn, ffn = self.attn, self.ffn
        w_qkv, w_o, w_13, w_2 = stacks
        x, h = _norm(x, pending, self.ln1, dtype)
        _rebuilt_norm(h, x, self.ln1)
        qkv = master_linear(h, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, stacked=w_qkv,
                            update=update)
        q, k, v = rope_qkv(qkv, cos, sin, attn.num_heads)
        o = self._attend(q, k, v)
        out = _merged_heads(o)
        rebuild_in_backward(out, _merged_heads, o)
        x, h = _norm(x, master_linear(out, attn.output_proj.weight, stacked=w_o, update=update),
                     self.ln2, dtype)
        _rebuilt_norm(h, x, self.ln2)
        gate_up = master_linear(h, ffn.w1.weight, ffn.w3.weight, stacked=w_13, update=update)
        hidden = swiglu(gate_up)
        rebuild_in_backward(hidden, swiglu, gate_up)
        return x, master_linear(hidden, ffn.w2.weight, stacked=w_2, update=update)


class FastTransformerLM(TransformerLM):
    """`TransformerLM` with fused kernels; forward(tokens, targets=None) -> logits or mean loss."""

    block_class = FastTransformerBlock

    def __init__(self, config: ModelConfig, attention: str = "flash") -> None:
        super().__init__(config, attention=attention)
        self._shadows: ShadowWeights | None = None
        self._shadow_dtype: torch.dtype | None = None  # set by shadow_weights(): copies are opt-in

    def _weight_groups(self) -> list[tuple[torch.Tensor, ...]]:
        """Per block, the weights of its four matmuls, stacked as each matmul reads them."""
        groups = []
        for layer in self.layers:
            attn, ffn = layer.attn, layer.ffn
            groups += [(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight),
                       (attn.output_proj.weight,), (ffn.w1.weight, ffn.w3.weight), (ffn.w2.weight,)]
        return groups

    def shadow_weights(self, dtype: torch.dtype) -> ShadowWeights | None:
        """Turn on persistent `dtype` copies of the block weights and return them (made as needed).

        From then on a forward in `dtype` over fp32 weights reads these instead of casting each
        weight every step; `lmscope.kernels.adamw.FusedAdamW(shadows=model.current_shadows)`
        writes them in its update, any other optimizer's step makes them re-copied (see
        `lmscope.model.shadow_weights`). Off by default. None (and off) when a block weight is
        shared between matmuls (tied), which one copy per weight cannot mirror.
        """
        groups = self._weight_groups()
        if self._shadows is None or not self._shadows.matches(groups, dtype):
            try:
                self._shadows = ShadowWeights(groups, dtype)
            except ValueError:
                self._shadows, self._shadow_dtype = None, None
                return None
        self._shadow_dtype = dtype
        return self._shadows

    def drop_shadow_weights(self) -> None:
        """Turn the bf16 copies off and free them, and the references they hold to the weights (a
        wrapper that replaces the parameters, such as FSDP, must not keep the old ones alive)."""
        self._shadows, self._shadow_dtype = None, None

    def current_shadows(self) -> ShadowWeights | None:
        """The copies the last forward read, if any (for FusedAdamW to update)."""
        return self._shadows

    def update_weights_in_backward(self, optimizer: torch.optim.Optimizer | None) -> None:
        """Hand the block matmuls' weight gradients to `optimizer` inside the backward (None: stop).

        `optimizer` is a ``FusedAdamW(step_in_backward=True)`` holding every trainable block
        weight: each matmul's backward computes its weight gradient in bf16 (the rounding
        autocast's eager model applies) and the optimizer updates the weights from it at once;
        those weights never get a ``.grad``. For training steps only: every backward through
        the model updates them, also ``torch.autograd.grad`` or ``backward(inputs=...)``; each
        block weight must feed one matmul once per backward (no tied weights, one forward per
        backward). Held weakly (a dropped optimizer stops it) and outside the module's state,
        so copies and pickles of the model are not wired.
        """
        if optimizer is None:
            _WEIGHT_UPDATES.pop(self, None)
            return
        weights = [w for group in self._weight_groups() for w in group]
        if len({id(w) for w in weights}) != len(weights):
            raise ValueError("a block weight feeds two matmuls (tied weights): its gradient arrives "
                             "in parts, which an update per part cannot take")
        trainable = [w for w in weights if w.requires_grad]
        takes = getattr(optimizer, "takes_gradients", None)
        if takes is None or not takes(trainable):
            raise ValueError("update_weights_in_backward needs a FusedAdamW(step_in_backward=True) "
                             "holding every trainable block weight")
        _WEIGHT_UPDATES[self] = weakref.ref(optimizer)

    def forward(self, token_ids: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, seq, vocab) in the compute dtype, or with targets the mean cross-entropy."""
        seq = token_ids.shape[-1]
        if seq > self.config.context_length:
            raise ValueError(
                f"sequence length {seq} exceeds the model's context_length "
                f"{self.config.context_length}: build the model with a larger context_length"
            )
        weight = self.lm_head.weight
        dtype = compute_dtype(weight.device, weight.dtype)
        with torch.autocast(weight.device.type, enabled=False):
            rope = self.layers[0].attn.rope
            cos, sin = rope.cos[:seq], rope.sin[:seq]
            # the embedding as a module (hooks apply); an fp32 residual stream over low-precision weights
            x = self.token_embeddings(token_ids)
            x = x.to(torch.promote_types(x.dtype, torch.float32))
            use_shadows = self._shadow_dtype == dtype and dtype != weight.dtype
            shadows = self.shadow_weights(dtype) if use_shadows else None
            wired = _WEIGHT_UPDATES.get(self)
            optimizer = wired() if wired is not None else None
            update = optimizer.update_with_gradients if optimizer is not None else None
            pending = None  # each block's FFN output, added to the residual by the next norm
            for index, layer in enumerate(self.layers):
                first = index * _MATMULS_PER_BLOCK  # _weight_groups' order: block by block
                stacks = ([shadows.stack(first + i) for i in range(_MATMULS_PER_BLOCK)] if shadows
                          else [None] * _MATMULS_PER_BLOCK)
                x, pending = layer(x, pending, cos, sin, dtype, stacks, update)
            x, h = _norm(x, pending, self.ln_final, dtype)
            if targets is None:
                return F.linear(h, weight.to(dtype))
            return fused_linear_cross_entropy(h.flatten(0, -2), weight, targets.flatten())


def _rebuilt_norm(h: torch.Tensor, x: torch.Tensor, norm: torch.nn.Module) -> None:
    """Under selective recompute, save the norm output h as the norm of the residual x it read."""
    if recording_recipes():
        recipe = functools.partial(rmsnorm, weight=norm.weight, eps=norm.eps, out_dtype=h.dtype)
        rebuild_in_backward(h, recipe, x)


def _merged_heads(o: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq, head_dim) attention output -> (batch, seq, heads * head_dim), a copy."""
    batch, heads, seq, head_dim = o.shape
    return o.transpose(1, 2).reshape(batch, seq, heads * head_dim)


def _norm(
    x: torch.Tensor, delta: torch.Tensor | None, norm: torch.nn.Module, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rmsnorm(x + delta) in `dtype`); the add is fused into the norm's kernels."""
    if delta is None:
        return x, rmsnorm(x, norm.weight, norm.eps, out_dtype=dtype)
    return add_rmsnorm(x, delta, norm.weight, norm.eps, out_dtype=dtype)
