"""The hf source: a transformers causal LM built from its config, with random weights.

``hf:<model_type>`` (``hf:llama``, ``hf:gpt2``, ``hf:qwen2``) takes transformers' default config
of that model type; ``hf:path/to/config.json`` a local config. Nothing is downloaded: no
tokenizer, no ``from_pretrained``, only ``AutoConfig.for_model`` and
``AutoModelForCausalLM.from_config``. The size overrides map to the config's own names
(d_model -> hidden_size or n_embd, d_ff -> intermediate_size, n_inner, ffn_hidden_size or d_ff,
num_layers, num_heads, vocab_size), moving the key/value heads and head_dim with them
(`lmscope.sources.hf_overrides`, which says where it did); the position table is raised to the
context length when shorter
(--model-context-length sets it). ``--attention`` picks ``attn_implementation``: naive -> eager,
sdpa -> sdpa, flash and flash-torch -> lmscope's kernels (`lmscope.sources.hf_attention`). The loss is fp32
cross-entropy of the logits against random targets, as for the presets; --checkpoint wraps
the decoder layers (the largest ModuleList of the model). ``--fast on`` (Llama, Qwen2, Mistral)
and ``--peer liger`` run the same model faster (`lmscope.sources.hf_speedups`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmscope.sources.contract import ModelSource, UserModel
from lmscope.sources.hf_attention import IMPLEMENTATIONS, check_config, register
from lmscope.sources.hf_overrides import override_changes
from lmscope.sources.preset import token_batch
from lmscope.sources.request import ModelRequest

PREFIX = "hf:"
ATTENTION = {"naive": "eager", "sdpa": "sdpa", **IMPLEMENTATIONS}
"""lmscope's --attention -> transformers' attn_implementation (flash: lmscope's kernels)."""
POSITIONS = ("max_position_embeddings", "n_positions")


def hf_source(request: ModelRequest) -> ModelSource:
    """Resolve hf:<model_type or config.json>: the config, checked by building the model on the
    meta device (no memory, no download). ValueError names what is wrong."""
    if request.attention not in ATTENTION:
        raise ValueError(f"{request.name}: --attention {request.attention} has no transformers "
                         f"implementation here: choose one of {', '.join(ATTENTION)}")
    config, adjusted = configure(request)
    if request.attention in IMPLEMENTATIONS:
        if not hasattr(_transformers(), "AttentionInterface"):
            raise ValueError(f"--attention {request.attention} with {request.name} needs transformers' "
                             "AttentionInterface (transformers >= 4.50): upgrade it or use --attention sdpa")
        check_config(config, request.name, request.attention)
    with torch.device("meta"):
        model = _causal_lm(config, request)
    from lmscope.sources.hf_speedups import check_speedup

    row_fields = check_speedup(request, config.model_type, model)
    return ModelSource(
        name=request.name, kind="hf", unit="tokens",
        build=lambda device: _build(config, request, device),
        blocks=len(decoder_layers(model)),
        has_optimizer=request.fast,
        row_fields=row_fields,
        context_limit=_positions(config),
        adjusted=tuple(adjusted),
    )


def hf_config(request: ModelRequest) -> Any:
    """The transformers config of the request, with its overrides (ValueError when it has none)."""
    return configure(request)[0]


def configure(request: ModelRequest) -> tuple[Any, list[str]]:
    """The transformers config of the request with its overrides, and a note per field moved with
    them (`hf_overrides`); ValueError (one line) when the config cannot take them."""
    transformers = _transformers()
    target = request.name[len(PREFIX):].strip()
    if not target:
        raise ValueError("hf: needs a model_type or a config.json path, e.g. hf:llama or hf:path/config.json")
    if target.endswith(".json") or "/" in target:
        fields = _read_json(Path(target))
        model_type = fields.pop("model_type", None)
        if not model_type:
            raise ValueError(f"{target} has no model_type: it is not a transformers config.json")
    else:
        model_type, fields = target, {}
    for key in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        fields.pop(key, None)
    try:
        base = transformers.AutoConfig.for_model(model_type, **fields)
    except Exception as error:  # whatever transformers raises here is about the user's config
        if model_type not in transformers.CONFIG_MAPPING:
            raise ValueError(f"unknown transformers model_type {model_type!r} ({request.name}): use one "
                             "such as llama, gpt2, qwen2, mistral, or a config.json path") from None
        raise ValueError(f"{request.name}: transformers refused the config: {_line(error)}") from None
    changes, adjusted = override_changes(base, request.overrides(), request.name)
    positions = next((name for name in POSITIONS if name in base.to_dict()), None)
    if positions is not None:
        limit = request.model_context_length or max(getattr(base, positions), request.context_length)
        changes[positions] = limit
    try:
        config = transformers.AutoConfig.for_model(model_type, **{**fields, **changes, "use_cache": False})
    except Exception as error:  # whatever transformers raises here is about the user's config
        raise ValueError(f"{request.name}: transformers refused the config: {_line(error)}") from None
    return config, adjusted


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The model's blocks: its ModuleList holding the most parameters."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no ModuleList of blocks")
    return max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))


def _build(config: Any, request: ModelRequest, device: torch.device) -> UserModel:
    with device:
        model = _causal_lm(config, request)
    from lmscope.sources.hf_speedups import LIGER, speedup_user_model

    if request.fast or request.peer == LIGER:
        return speedup_user_model(model, config.model_type, request, token_batch(config.vocab_size), device,
                                  decoder_layers(model))
    from lmscope.sources.preset import logits_loss

    return UserModel(model=_Logits(model), make_batch=token_batch(config.vocab_size), loss=logits_loss,
                     unit="tokens", blocks=decoder_layers(model))


class _Logits(nn.Module):
    """A transformers causal LM called as model(token_ids) -> logits, like lmscope's models."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=token_ids).logits


def _causal_lm(config: Any, request: ModelRequest) -> nn.Module:
    transformers = _transformers()
    try:
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation=ATTENTION[request.attention])
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError, IndexError) as error:
        raise ValueError(f"{request.name}: transformers cannot build a causal LM from this config: "
                         f"{_line(error)}") from None
    return model.float()  # fp32 master weights, whatever dtype the config names


def _positions(config: Any) -> int | None:
    return next((int(v) for name in POSITIONS if isinstance(v := getattr(config, name, None), int)), None)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"hf config {path} does not exist: give a config.json path or a model_type")
    try:
        fields = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read hf config {path}: {_line(error)}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"hf config {path} is not a JSON object")
    return fields


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ValueError("hf: models need HF transformers: install lmscope[hf] "
                         "(pip install 'lmscope[hf]')") from None
    transformers.logging.set_verbosity_error()
    register(transformers)
    return transformers


def _line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]
