"""`resolve_source`: a model request -> its `ModelSource` (preset, hf:..., or module:factory).

Resolved once per process and request (the command line checks every point with it before
anything runs; the worker resolves again and builds).
"""

from __future__ import annotations

from functools import lru_cache

from lmscope.sources.contract import ModelSource
from lmscope.sources.factory import factory_source, is_factory
from lmscope.sources.hf import PREFIX, hf_source
from lmscope.sources.preset import preset_source
from lmscope.sources.request import ModelRequest


@lru_cache(maxsize=64)
def resolve_source(request: ModelRequest) -> ModelSource:
    """The source `request.name` names; ValueError (one line) when it cannot be used."""
    kind = source_kind(request.name)
    return {"hf": hf_source, "factory": factory_source, "preset": preset_source}[kind](request)


def source_kind(name: str) -> str:
    """preset | hf | factory, from the spelling of --model alone (nothing is imported)."""
    if not name.strip():
        raise ValueError("--model is empty: give a preset (tiny, small, ...), hf:<model_type or "
                         "config.json>, or <module or file.py>:<factory>")
    if name.startswith(PREFIX):
        return "hf"
    return "factory" if is_factory(name) else "preset"
