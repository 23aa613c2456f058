"""The transformers model families lmscope's fast path runs: their module classes, by role.

Llama, Qwen2 and Mistral share one architecture: pre-norm RMSNorm (x / rms * weight), a SwiGLU
MLP (gate, up, down projections), attention with rotate-half RoPE and grouped key/value heads,
an LM head. Their modules are classes of their own (``LlamaRMSNorm``, ``Qwen2MLP``,
``MistralAttention``, ...), so a model is recognized by the classes of its modules, not by its
name: any model built of these classes (subclasses included) is handled. The classes are looked
up by name in ``transformers.models.<family>.modeling_<family>``; a family or class a
transformers version does not have is left out.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache

from torch import nn

FAMILIES = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral"}
"""model_type -> the class-name prefix of its modules."""
ROLES = {"norm": "RMSNorm", "mlp": "MLP", "attention": "Attention", "causal_lm": "ForCausalLM",
         "base": "Model"}
"""What a module does -> the class-name suffix of the family's class for it (base: the decoder
stack, LlamaModel, whose inputs the fast path checks)."""


@dataclass(frozen=True)
class FamilyClass:
    """One family's class for one role."""

    family: str
    role: str
    cls: type


@lru_cache(maxsize=1)
def family_classes() -> tuple[FamilyClass, ...]:
    """Every (family, role, class) this transformers has; empty without transformers."""
    found = []
    for family, prefix in FAMILIES.items():
        try:
            module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except ImportError:
            continue
        for role, suffix in ROLES.items():
            cls = getattr(module, prefix + suffix, None)
            if isinstance(cls, type):
                found.append(FamilyClass(family, role, cls))
    return tuple(found)


def classify(module: nn.Module) -> FamilyClass | None:
    """The family class `module` is an instance of, if any (the most derived match first)."""
    matches = [fc for fc in family_classes() if isinstance(module, fc.cls)]
    return min(matches, key=lambda fc: type(module).__mro__.index(fc.cls)) if matches else None


def supported_families() -> str:
    """The families, for messages: 'llama, qwen2, mistral'."""
    return ", ".join(FAMILIES)
