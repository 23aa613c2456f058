"""`resolve_source`: a model request -> its `ModelSource` (preset, hf:..., or module:factory).

Resolved once per process and request (the command line checks every point with it before
anything runs; the worker resolves again and builds).
"""

from __future__ import annotations

from functools import lru_cache

from lmscope.inputs.choices import source_kind
from lmscope.sources.contract import ModelSource
from lmscope.sources.factory import factory_source
from lmscope.sources.hf import hf_source
from lmscope.sources.preset import preset_source
from lmscope.sources.request import ModelRequest


@lru_cache(maxsize=64)
def resolve_source(request: ModelRequest) -> ModelSource:
    """The source `request.name` names; ValueError (one line) when it cannot be used."""
    kind = source_kind(request.name)
    return {"hf": hf_source, "factory": factory_source, "preset": preset_source}[kind](request)


__all__ = ["resolve_source", "source_kind"]
