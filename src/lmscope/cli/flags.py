"""The flags of the commands that run points, parsed and checked before anything imports torch:
comma lists into typed values, and the model flags (--model/--size and the swept axes every
Transformer LM command shares).
"""

from __future__ import annotations

from typing import Any

from lmscope.inputs.choices import check_choices
from lmscope.inputs.comma_list import list_items
from lmscope.inputs.grid import expand_grid
from lmscope.workloads.cpu_points import refuse_triton_attention_on_cpu

TRUE_WORDS = {"on": True, "true": True, "yes": True, "1": True,
              "off": False, "false": False, "no": False, "0": False}


def split_list(value: str, cast: type, flag: str) -> list[Any]:
    """Parse a comma list such as '128,256' or 'fp32,bf16' into typed values, in order."""
    items = list_items(value, flag)
    out = []
    for item in items:
        if cast is bool:
            if item.lower() not in TRUE_WORDS:
                raise ValueError(f"{flag} takes on/off (or a list like off,on), got {item!r}")
            out.append(TRUE_WORDS[item.lower()])
        elif cast is int:
            try:
                out.append(int(item))
            except ValueError:
                raise ValueError(f"{flag} takes integers (e.g. 128,256), got {item!r}") from None
        elif cast is float:
            try:
                out.append(float(item))
            except ValueError:
                raise ValueError(f"{flag} takes numbers, got {item!r}") from None
        else:
            out.append(item)
    return list(dict.fromkeys(out))


def model_flag(model: str | None, size: str | None) -> str | None:
    """--model, or its alias --size; both at once is a mistake."""
    if model is not None and size is not None:
        raise ValueError("--model and --size name the same thing: give one of them")
    return model if model is not None else size


def model_axes(
    *,
    size: str | None,
    context_length: str,
    batch_size: str,
    precision: str,
    device: str,
    mode: str | None = None,
    compile: str | None = None,
    attention: str | None = None,
    compile_scope: str | None = None,
) -> dict[str, list[Any]]:
    """The swept axes shared by the commands that run the Transformer LM, parsed from their flags
    and checked (with --device, which is not swept) before anything imports torch.

    A flag a command does not have is None and is left out, and so is --model when not given
    (`model_grid` adds the default preset once every flag is known to be right). `--compile`
    values are on/off words (True/False) or torch.compile mode names, which the spec checks.
    """
    flags: dict[str, tuple[str | None, type]] = {
        "size": (size, str),
        "context_length": (context_length, int),
        "batch_size": (batch_size, int),
        "mode": (mode, str),
        "precision": (precision, str),
        "compile": (compile, str),
        "attention": (attention, str),
        "compile_scope": (compile_scope, str),
    }
    axes = {
        name: split_list(value, cast, "--" + name.replace("_", "-"))
        for name, (value, cast) in flags.items()
        if value is not None
    }
    if "compile" in axes:
        axes["compile"] = list(dict.fromkeys(TRUE_WORDS.get(v.lower(), v) for v in axes["compile"]))
    check_choices({**axes, "device": device})
    return axes


def model_grid(swept: dict[str, list[Any]], fixed: dict[str, Any] | None = None) -> dict[str, list[Any]]:
    """A model command's swept axes, every choice of them and of its `fixed` fields checked
    (--peer, --cuda-graph, --checkpoint, --strategy too; --attention flash on an explicit
    --device cpu), and the default preset first where --model was not given: torch is imported
    only after this."""
    fixed = fixed or {}
    check_choices({**fixed, **swept})
    if fixed.get("device", "auto") != "auto":  # auto needs torch to know
        refuse_triton_attention_on_cpu(expand_grid(fixed, swept))
    return swept if "size" in swept else {"size": [default_size()], **swept}


def default_size() -> str:
    """The preset when --model is not given: small on a GPU, tiny on the CPU."""
    import torch

    return "small" if torch.cuda.is_available() else "tiny"
