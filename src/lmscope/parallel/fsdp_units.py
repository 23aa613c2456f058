"""Which submodules FullyShardedDP gathers one at a time (its *units*), and who owns each parameter.

Units come from one of three places:

* **A list of modules**, in forward order (`units=[model.embed, *model.blocks, model.head]`).
  The order is a promise: the first forward checks it and names the fix when it does not hold.
* **A class policy**, a tuple of module classes (`units=(nn.Linear, nn.Embedding)`): every
  outermost submodule of those classes, as `fully_shard` is applied in a loop with FSDP2. The
  model's registration order need not be its forward order (SwiGLU registers w1, w2, w3 and
  runs w1, w3, w2), so the order is taken from the first forward.
* **The default** (`units=None`, `default_units`): lmscope's TransformerLM / FastTransformerLM,
  and any transformers model, whose decoder layers are the classes it names in
  `_no_split_modules` (GPT-2's GPT2Block, Llama's LlamaDecoderLayer, Qwen2, Mistral, ...), with
  its input embeddings first and its output embeddings last. The order is taken from the first
  forward too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import nn

UnitsSpec = Sequence[nn.Module] | tuple[type[nn.Module], ...] | None
"""What `FullyShardedDP(units=...)` takes: modules in forward order, a tuple of classes, or None."""


def resolve_units(model: nn.Module, units: UnitsSpec) -> tuple[list[nn.Module], bool]:
    """(the units, whether their order is to be learned from the first forward) for `units`."""
    if units is None:
        return default_units(model), True
    chosen = list(units)
    if chosen and all(isinstance(u, type) and issubclass(u, nn.Module) for u in chosen):
        return units_by_class(model, tuple(chosen)), True
    if not all(isinstance(u, nn.Module) for u in chosen):
        raise TypeError("units must be submodules in forward order or a tuple of module classes, "
                        "e.g. units=(nn.Linear, nn.Embedding)")
    return chosen, False


def units_by_class(model: nn.Module, classes: tuple[type[nn.Module], ...]) -> list[nn.Module]:
    """Every outermost submodule of `model` that is an instance of `classes`, in module order."""
    found = outermost(model, lambda module: isinstance(module, classes))
    if not found:
        names = ", ".join(c.__name__ for c in classes)
        raise ValueError(f"{type(model).__name__} has no submodule of class {names}: "
                         "name the classes its layers are built from, or pass units=[...]")
    return found


def default_units(model: nn.Module) -> list[nn.Module]:
    """The units of lmscope's TransformerLM / FastTransformerLM and of any transformers model.

    TransformerLM: the embedding, each block, the LM head (the final norm stays in the root).
    FastTransformerLM reads the head's weight directly (fused with the loss), so the head stays
    in the root. A transformers model (a `_no_split_modules` list): its input embeddings, each
    module of a class named there (the decoder layers), its output embeddings; the same for a
    module that wraps one (the `hf:` source calls it as model(token_ids) through a wrapper).
    """
    from lmscope.model.fast_transformer import FastTransformerLM
    from lmscope.model.transformer import TransformerLM

    if isinstance(model, FastTransformerLM):
        return [model.token_embeddings, *model.layers]
    if isinstance(model, TransformerLM):
        return [model.token_embeddings, *model.layers, model.lm_head]
    hf = transformers_model(model)
    layer_classes = set(getattr(hf, "_no_split_modules", None) or ())
    layers = outermost(hf, lambda module: type(module).__name__ in layer_classes) if hf else []
    if not layers:
        raise ValueError(f"no default units for {type(model).__name__}: pass units=[...] in forward "
                         "order, or a class policy such as units=(nn.Linear, nn.Embedding)")
    ends = [_embeddings(hf, "get_input_embeddings"), _embeddings(hf, "get_output_embeddings")]
    return [m for m in ends[:1] if m is not None] + layers + [m for m in ends[1:] if m is not None]


def transformers_model(model: nn.Module) -> nn.Module | None:
    """`model` or its outermost submodule that lists `_no_split_modules` (None where none does)."""
    return next((m for m in model.modules() if getattr(m, "_no_split_modules", None)), None)


def _embeddings(model: nn.Module, getter: str) -> nn.Module | None:
    """A transformers model's input or output embeddings (None where it has none)."""
    try:
        module = getattr(model, getter)()
    except (AttributeError, NotImplementedError):
        return None
    return module if isinstance(module, nn.Module) else None


def outermost(model: nn.Module, wanted: Callable[[nn.Module], bool]) -> list[nn.Module]:
    """The submodules (not `model`) for which `wanted(module)` holds and no chosen ancestor does."""
    chosen: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if module is model or id(module) in inside:
            continue
        if wanted(module):
            chosen.append(module)
            inside.update(id(sub) for sub in module.modules())
    return chosen


Owners = dict[nn.Parameter, tuple[int, list[tuple[nn.Module, str]]]]


def parameter_owners(model: nn.Module, units: list[nn.Module]) -> Owners:
    """Parameter -> (index of the unit that owns it; len(units) for the root, where), in model order.

    A parameter attached only inside one unit belongs to that unit; one attached outside every
    unit, or inside several (tied), belongs to the root, which stays gathered for the whole step.
    """
    if any(unit is model for unit in units):
        raise ValueError("the whole model cannot be a unit: pass its blocks")
    in_units: dict[int, set[int]] = {}  # id(submodule) -> the units it is part of (shared ones: several)
    for index, unit in enumerate(units):
        for sub in unit.modules():
            if sub is not unit and any(sub is other for other in units):
                raise ValueError("one unit holds another: pass disjoint submodules as units")
            in_units.setdefault(id(sub), set()).add(index)
    found: dict[nn.Parameter, tuple[set[int], list[tuple[nn.Module, str]]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is None:
                continue
            indices, where = found.setdefault(param, (set(), []))
            indices.update(in_units.get(id(module), {len(units)}))
            where.append((module, name))
    return {p: (next(iter(i)) if len(i) == 1 else len(units), w) for p, (i, w) in found.items()}
