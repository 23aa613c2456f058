"""lmscope's fast path on a transformers Llama, Qwen2 or Mistral model, for one's own loop.

``apply_to_hf_model(model)`` runs the model's modules through lmscope's fused kernels in place
and returns a `FastPatch` that says which modules it replaced. The parameters stay the same
objects (names, shapes, state dict, an optimizer made before keep working); only forwards change:

* norm (``*RMSNorm``): ``lmscope.kernels.rmsnorm``, output straight in the autocast dtype;
* mlp (``*MLP``, SiLU): one matmul against [gate; up], ``lmscope.kernels.swiglu``, down;
* attention (``*Attention``): one matmul against [q; k; v] (biases added: Qwen2), the RoPE
  kernel in transformers' rotate-half layout with the model's own cos/sin (so every RoPE
  scaling its rotary module computes: default, linear, llama3, yarn, dynamic, ...) that also
  repeats grouped key/value heads to the query heads, lmscope's FlashAttention (``flash``, Triton;
  ``flash-torch``, its tiled PyTorch version; or torch's SDPA, ``sdpa`` and ``sdpa-cudnn``), the
  output projection;
* lm_head and loss (``*ForCausalLM``): given ``labels`` (or ``shift_labels``) the model's forward
  returns transformers' loss (labels shifted by one, -100 ignored, ``num_items_in_batch``) from
  lmscope's fused LM head + cross-entropy, which never holds the full logits (``logits`` is None
  then); without labels it is transformers' own forward.

Every matmul of a block hands its weight gradient back in the weights' dtype straight from the
matmul (fp32 out of bf16 inputs), and `FastPatch.fused_adamw` gives lmscope's FusedAdamW, which
also keeps persistent bf16 copies of the block weights current so autocast never casts them.

The model's ``attn_implementation`` becomes lmscope's (``lmscope_fa2``, ...), which transformers
builds no mask for: no host synchronization per step, so the step can be captured in a CUDA
graph. The attention is causal over whole rows: a padding mask is refused (an all-ones one is
accepted, at one host synchronization), and so are sliding windows shorter than the sequence
(Mistral) and decoding with a KV cache (a cache is filled on its first forward). Modules that are
not plain ``nn.Linear`` projections (LoRA adapters, quantized layers), attention dropout, a
scale other than 1/sqrt(head_dim), activations other than SiLU and an LM head with a bias are
refused with one line before anything changes. See docs/own_model.md.
"""

from __future__ import annotations

import importlib.util
import types
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmscope.model.hf_families import classify, supported_families
from lmscope.model.shadow_weights import ShadowWeights

ATTENTIONS = ("flash", "flash-torch", "sdpa", "sdpa-cudnn")
"""lmscope attention backends the patched attention runs: its Triton FlashAttention (flash), its
tiled PyTorch version (flash-torch: CPU tests), torch's SDPA, torch's SDPA pinned to cuDNN."""
PROJECTIONS = {"attention": (("q_proj", "k_proj", "v_proj"), ("o_proj",)),
               "mlp": (("gate_proj", "up_proj"), ("down_proj",))}
"""Per role, the projections each fused matmul reads, stacked in this order."""
REPLACED = ("norm", "mlp", "attention", "causal_lm")
"""The roles whose modules compute differently once patched, in the order summaries list them."""
SILU = ("silu", "swish")
_PATCH = "lmscope_fast"
"""The attribute of the model that holds its FastPatch."""


@dataclass
class _Target:
    """One module to patch: its name in the model, role and family."""

    name: str
    module: nn.Module
    role: str
    family: str


@dataclass(frozen=True)
class FastPlan:
    """What `apply_to_hf_model` would replace (checked, nothing changed yet)."""

    targets: tuple[_Target, ...]
    attention: str

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.family for t in self.targets))

    @property
    def replaced(self) -> dict[str, tuple[str, ...]]:
        """role -> the qualified names of the modules of that role whose computation is replaced
        (the decoder stacks, whose forward only checks the inputs, are not listed)."""
        out: dict[str, list[str]] = {}
        for target in self.targets:
            if target.role in REPLACED:
                out.setdefault(target.role, []).append(target.name or "<model>")
        return {role: tuple(names) for role, names in out.items()}

    def summary(self) -> str:
        """role=count pairs, e.g. 'norm=33,mlp=16,attention=16,causal_lm=1' (the rows' field)."""
        counts = Counter(t.role for t in self.targets)
        return ",".join(f"{role}={counts[role]}" for role in REPLACED if counts[role])


def plan_fast_patch(model: nn.Module, attention: str = "flash") -> FastPlan:
    """The modules of `model` lmscope's fast path replaces; ValueError (one line) when it cannot.

    Imports no kernel and touches no tensor, so it runs on a meta-device model.
    """
    if attention not in ATTENTIONS:
        raise ValueError(f"attention={attention!r}: the fast path runs lmscope's attention backends, "
                         f"choose one of {', '.join(ATTENTIONS)}")
    if getattr(model, _PATCH, None) is not None:
        raise ValueError(f"{type(model).__name__} runs lmscope's fast path already: apply it once")
    _check_transformers()
    targets = []
    for name, module in model.named_modules():
        found = classify(module)
        if found is not None:
            targets.append(_Target(name, module, found.role, found.family))
    if not any(t.role in REPLACED for t in targets):
        raise ValueError(f"{type(model).__name__} has no module of the families lmscope's fast path "
                         f"runs (transformers' {supported_families()})")
    config = getattr(model, "config", None)
    for target in targets:
        _check(target, config)
    return FastPlan(tuple(targets), attention)


def _check_transformers() -> None:
    """transformers >= 4.53: masks made per attention implementation (none for lmscope's)."""
    import transformers

    if importlib.util.find_spec("transformers.masking_utils") is None:
        raise ValueError(f"lmscope's fast path needs transformers >= 4.53 (masks built per attention "
                         f"implementation), this is {transformers.__version__}: upgrade it")


def _check(target: _Target, model_config: Any) -> None:
    """Refuse what the fused forward of `target` would compute differently (one line)."""
    module, where = target.module, f"{target.name or type(target.module).__name__}"
    for group in PROJECTIONS.get(target.role, ()):
        for attribute in group:
            layer = getattr(module, attribute, None)
            if type(layer) is not nn.Linear:
                raise ValueError(f"{where}.{attribute} is a {type(layer).__name__}, not a torch.nn.Linear "
                                 "(an adapter or a quantized layer): the fast path reads plain weights")
    config = getattr(module, "config", None) or model_config
    if target.role == "mlp":
        act = getattr(config, "hidden_act", None)
        if act not in SILU:
            raise ValueError(f"{where}: activation {act!r}; the fast path's SwiGLU is SiLU-gated")
    elif target.role == "attention":
        head_dim = module.head_dim
        if head_dim % 2 or head_dim > 128:
            raise ValueError(f"{where}: head_dim {head_dim}; lmscope's FlashAttention and RoPE take even "
                             "head dims up to 128")
        if module.q_proj.out_features % module.k_proj.out_features:
            raise ValueError(f"{where}: query heads are not a multiple of key/value heads")
        if float(getattr(module, "attention_dropout", 0.0) or 0.0) > 0:
            raise ValueError(f"{where}: attention_dropout {module.attention_dropout}; lmscope's "
                             "FlashAttention has no dropout: set config.attention_dropout = 0")
        scaling = getattr(module, "scaling", head_dim**-0.5)
        if abs(scaling - head_dim**-0.5) > 1e-6 * head_dim**-0.5:
            raise ValueError(f"{where}: attention scale {scaling}; lmscope's FlashAttention scales by "
                             "1/sqrt(head_dim)")
        if not getattr(module, "is_causal", True):
            raise ValueError(f"{where} is not causal; lmscope's FlashAttention here is")
    elif target.role == "causal_lm":
        head = getattr(module, "lm_head", None)
        if type(head) is not nn.Linear or head.bias is not None:
            raise ValueError(f"{where}.lm_head must be a torch.nn.Linear without bias for the fused "
                             "LM head + loss")


class FastPatch:
    """What `apply_to_hf_model` replaced, and the fast path's state: the bf16 weight copies."""

    def __init__(self, model: nn.Module, plan: FastPlan) -> None:
        self.model = model
        self.plan = plan
        self.attention = plan.attention
        self.families = plan.families
        self.replaced = plan.replaced
        """role -> qualified module names (norm, mlp, attention, causal_lm)."""
        self._projections: list[tuple[nn.Module, tuple[str, ...]]] = []
        self._shadows: ShadowWeights | None = None
        self._shadow_dtype: torch.dtype | None = None

    def summary(self) -> str:
        """role=count pairs, e.g. 'norm=33,mlp=16,attention=16,causal_lm=1'."""
        return self.plan.summary()

    def add_projections(self, module: nn.Module, groups: tuple[tuple[str, ...], ...]) -> tuple[int, ...]:
        """Register a module's fused matmuls (attribute names per matmul); their group indices."""
        first = len(self._projections)
        self._projections += [(module, group) for group in groups]
        return tuple(range(first, len(self._projections)))

    def _weight_groups(self) -> list[tuple[torch.Tensor, ...]]:
        return [self.weights(index) for index in range(len(self._projections))]

    def linears(self, index: int) -> tuple[nn.Linear, ...]:
        """The projections matmul group `index` stacks."""
        module, group = self._projections[index]
        return tuple(getattr(module, name) for name in group)

    def weights(self, index: int) -> tuple[torch.Tensor, ...]:
        """The current weights of matmul group `index` (read from the modules: a wrapper such as
        FSDP may have replaced them)."""
        return tuple(layer.weight for layer in self.linears(index))

    def shadow_weights(self, dtype: torch.dtype) -> ShadowWeights | None:
        """Turn on persistent `dtype` copies of the block weights (made now); None if impossible.

        From then on a forward under autocast to `dtype` over fp32 weights reads these instead of
        casting every weight every step; FusedAdamW(shadows=patch.current_shadows) writes them in
        its update, any other optimizer's step makes them re-copied (lmscope.model.shadow_weights).
        """
        groups = self._weight_groups()
        if self._shadows is None or not self._shadows.matches(groups, dtype):
            try:
                self._shadows = ShadowWeights(groups, dtype)
            except ValueError:  # a weight in two matmuls (tied): one copy per weight cannot mirror it
                self._shadows, self._shadow_dtype = None, None
                return None
        self._shadow_dtype = dtype
        return self._shadows

    def current_shadows(self) -> ShadowWeights | None:
        """The copies in use, if any (for FusedAdamW to update)."""
        return self._shadows

    def drop_shadow_weights(self) -> None:
        """Turn the copies off and free them and their references to the weights (before a wrapper
        such as FSDP replaces the parameters)."""
        self._shadows, self._shadow_dtype = None, None

    def stack(self, index: int, weights: tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """Group `index`'s persistent copy for a forward in `dtype`, or None: cast them instead."""
        if self._shadows is None or self._shadow_dtype != dtype or weights[0].dtype == dtype:
            return None
        return self._shadows.stack_of(index, weights)

    def fused_adamw(self, lr: float = 1e-4, *, shadow_dtype: torch.dtype | None = torch.bfloat16,
                    **options: Any) -> torch.optim.Optimizer:
        """lmscope's FusedAdamW over the model's parameters (torch.optim.AdamW's math and options).

        With `shadow_dtype` (the autocast dtype of the training loop) it turns the bf16 weight
        copies on and keeps them current in its update. Triton: CUDA, or the CPU interpreter.
        """
        from lmscope.kernels.adamw import FusedAdamW

        if shadow_dtype is not None:
            self.shadow_weights(shadow_dtype)
        return FusedAdamW(self.model.parameters(), lr=lr, shadows=self.current_shadows, **options)


def apply_to_hf_model(model: nn.Module, *, attention: str = "flash") -> FastPatch:
    """Run `model`'s Llama/Qwen2/Mistral modules through lmscope's fused kernels, in place.

    `attention`: flash (lmscope's Triton FlashAttention-2; CUDA, or the CPU interpreter),
    flash-torch (its tiled PyTorch version), sdpa (torch's) or sdpa-cudnn (torch's pinned to
    cuDNN's kernel; CUDA). Returns what was replaced (`FastPatch.replaced`,
    `.summary()`); `fast_patch_of(model)` finds it again. ValueError, with the model unchanged,
    when a module cannot run fused (see the module docstring).
    """
    plan = plan_fast_patch(model, attention)
    from lmscope.model import hf_fast_forward as forward

    patch = FastPatch(model, plan)
    _use_lmscope_attention(model, plan, attention)
    for target in plan.targets:
        module = target.module
        if target.role in PROJECTIONS:
            groups = patch.add_projections(module, PROJECTIONS[target.role])
            module._lmscope_fast_context = forward.Context(patch, groups)
        elif target.role == "causal_lm":
            module.lm_head.forward = types.MethodType(forward.lm_head_forward, module.lm_head)
        module.forward = types.MethodType(getattr(forward, f"{target.role}_forward"), module)
    setattr(model, _PATCH, patch)
    return patch


def sliding_window(attention: nn.Module) -> int | None:
    """An attention layer's sliding window: its own (Qwen2, per layer) or its config's (Mistral)."""
    if hasattr(attention, "sliding_window"):
        return attention.sliding_window
    config = getattr(attention, "config", None)
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return getattr(config, "sliding_window", None)


def fast_patch_of(model: nn.Module) -> FastPatch | None:
    """The `FastPatch` of a model `apply_to_hf_model` patched, else None."""
    return getattr(model, _PATCH, None)


def _use_lmscope_attention(model: nn.Module, plan: FastPlan, attention: str) -> None:
    """Make the configs name lmscope's attention implementation, for which transformers builds no
    mask (no per-step host synchronization; CUDA-graph capturable)."""
    import transformers

    from lmscope.sources.hf_attention import FAST_IMPLEMENTATIONS, register

    register(transformers)
    configs = {id(c): c for c in _configs(model, plan)}
    for config in configs.values():
        config._attn_implementation = FAST_IMPLEMENTATIONS[attention]


def _configs(model: nn.Module, plan: FastPlan) -> Iterator[Any]:
    for module in (model, *(t.module for t in plan.targets)):
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            yield config

