"""lmscope's size overrides (--d-model, --num-heads, ...) as changes to a transformers config.

Each override maps to the config's own name for it (`NAMES`). Overriding the heads or the width
also moves the fields that must agree with them, and says so where the config's own relation is
not kept as is:

* key/value heads (`num_key_value_heads`, Falcon's `num_kv_heads`): a multi-head config stays
  multi-head (one key/value head per head, silently); a grouped-query config keeps its query
  heads per key/value head where that divides the new head count (mistral's 32:8 becomes 4:1 at
  --num-heads 4), else the nearest group size that does. Left at 8 for 4 heads, the model
  cannot run.
* `head_dim`, where the config has one: d_model / num_heads of the new sizes. A config whose
  head_dim was already d_model / num_heads changes silently; one that sets it apart (gemma:
  256 for 3072 / 16) is said, since keeping it would build a model of another size than asked.

The notes end up in each row as `overrides_adjusted`.
"""

from __future__ import annotations

from typing import Any

NAMES = {
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "d_ff": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads"),
    "vocab_size": ("vocab_size",),
}
"""lmscope's override -> the config names that may hold it, first match wins."""
KV_HEADS = ("num_key_value_heads", "num_kv_heads")
HEAD_DIM = ("head_dim", "d_kv")


def override_changes(base: Any, overrides: dict[str, int], source: str) -> tuple[dict[str, Any], list[str]]:
    """Config fields to set for `overrides` on config `base`, and one note per field moved that
    the user did not name and whose relation to the others was not kept as is.

    ValueError (one line) when the config has no field for an override, the vocabulary would
    leave out the pad token, or the new width and heads give no whole head_dim.
    """
    changes = {config_name(base, key, source): value for key, value in overrides.items()}
    pad = getattr(base, "pad_token_id", None)
    if "vocab_size" in overrides and isinstance(pad, int) and pad >= overrides["vocab_size"]:
        raise ValueError(f"{source}: --vocab-size {overrides['vocab_size']} leaves out the config's "
                         f"pad_token_id {pad}: give --vocab-size above {pad}")
    notes: list[str] = []
    heads_name, width_name = _field(base, NAMES["num_heads"]), _field(base, NAMES["d_model"])
    if heads_name is None or width_name is None:
        return changes, notes
    heads, width = getattr(base, heads_name), getattr(base, width_name)
    new_heads, new_width = overrides.get("num_heads", heads), overrides.get("d_model", width)
    kv_name = _field(base, KV_HEADS)
    kv = getattr(base, kv_name, None) if kv_name else None
    if "num_heads" in overrides and isinstance(kv, int) and kv > 0 and new_heads != heads:
        new_kv = new_heads if kv == heads else _kv_heads(heads // kv, new_heads)
        if new_kv != kv:
            changes[kv_name] = new_kv
            if kv != heads:
                notes.append(_kv_note(kv_name, kv, new_kv, heads // kv, new_heads))
    dim_name = _field(base, HEAD_DIM)
    head_dim = getattr(base, dim_name, None) if dim_name else None
    if isinstance(head_dim, int) and ("num_heads" in overrides or "d_model" in overrides):
        if new_width % new_heads:
            raise ValueError(f"{source}: d_model {new_width} is not a multiple of num_heads {new_heads}, "
                             "so it has no whole head_dim: pick --d-model a multiple of --num-heads")
        new_dim = new_width // new_heads
        if new_dim != head_dim:
            changes[dim_name] = new_dim
            if head_dim * heads != width:
                notes.append(f"{dim_name} {head_dim} -> {new_dim} (d_model / num_heads; the config's "
                             f"{head_dim} is not {width} / {heads})")
    return changes, notes


def config_name(config: Any, key: str, source: str) -> str:
    """The name under which `config` holds lmscope's override `key` (ValueError when none)."""
    name = _field(config, NAMES[key])
    if name is None:
        flag = "--" + key.replace("_", "-")
        raise ValueError(f"{source}: its config has no field for {flag} (looked for {', '.join(NAMES[key])})")
    return name


def _field(config: Any, names: tuple[str, ...]) -> str | None:
    """The first of `names` the config holds (through its attribute_map), as the config calls it."""
    fields = config.to_dict()
    aliases = getattr(type(config), "attribute_map", {})
    return next((aliases.get(name, name) for name in names if aliases.get(name, name) in fields), None)


def _kv_heads(group: int, heads: int) -> int:
    """Key/value heads for `heads` query heads: `group` per key/value head where it divides,
    else the divisor of `heads` whose group is nearest (the larger group on a tie)."""
    divisors = [d for d in range(1, heads + 1) if heads % d == 0]
    return min(divisors, key=lambda d: (abs(heads // d - group), d))


def _kv_note(name: str, kv: int, new_kv: int, group: int, heads: int) -> str:
    kept = heads // new_kv
    if kept == group:
        return f"{name} {kv} -> {new_kv} (keeps {group} query heads per key/value head)"
    return (f"{name} {kv} -> {new_kv} ({kept} query heads per key/value head: the config's {group} "
            f"does not divide {heads} heads)")
