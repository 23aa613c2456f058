"""Where a model comes from: a preset, a transformers config, or a user's factory.

Each resolves to one `ModelSource` whose `build(device)` gives a `UserModel` (model, batch,
loss, optimizer); every workload reads those and never asks which source it was.
"""

from lmscope.sources.contract import ModelSource, UserModel
from lmscope.sources.request import ModelRequest
from lmscope.sources.resolve import resolve_source, source_kind

__all__ = ["ModelRequest", "ModelSource", "UserModel", "resolve_source", "source_kind"]
