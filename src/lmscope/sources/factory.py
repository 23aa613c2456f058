"""The factory source: ``<module.path or path/to/file.py>:<factory>``, a user's own model.

The module is imported (a file by its path, a module from sys.path and the working folder),
and ``factory(**kwargs)`` must return a `lmscope.sources.UserModel`. It is called with the
keyword arguments its signature names among: the size overrides given (--d-model ... as
d_model ...: an override it does not take is refused), ``context_length`` (the model's) and
``attention`` (lmscope's backend name; a backend other than naive is refused when it does not
take one). lmscope calls the factory under ``with device:``, so modules it creates are made on
the point's device. To check a source cheaply the command line calls it once on the meta device
(falling back to the CPU if that fails); every mistake is a ValueError of one line.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from lmscope.sources.contract import ModelSource, UserModel
from lmscope.sources.request import ModelRequest


def factory_source(request: ModelRequest) -> ModelSource:
    """Import the factory, call it on the meta device and check what it returns."""
    if request.fast:
        raise ValueError(f"--fast on runs lmscope's presets and transformers' Llama, Qwen2 and Mistral "
                         f"(hf:...), not {request.name}: drop --fast (or apply lmscope.model.hf_fast in the "
                         "factory)")
    if request.peer != "none":
        raise ValueError(f"--peer {request.peer} is not a peer of {request.name}: drop --peer")
    factory = load_factory(request.name)
    kwargs = factory_kwargs(factory, request)
    try:
        probe = call_factory(factory, kwargs, request.name, torch.device("meta"))
    except ValueError:
        probe = call_factory(factory, kwargs, request.name, torch.device("cpu"))
    return ModelSource(
        name=request.name, kind="factory", unit=probe.unit,
        build=lambda device: call_factory(factory, kwargs, request.name, device),
        blocks=None if probe.blocks is None else len(probe.blocks),
        has_optimizer=probe.optimizer is not None,
    )


def load_factory(name: str) -> Callable[..., Any]:
    """The callable that `module:function` or `file.py:function` names."""
    target, _, attribute = name.rpartition(":")
    if not target or not attribute:
        raise ValueError(f"--model {name!r}: a factory is <module or file.py>:<function>, "
                         "e.g. examples/own_lm.py:build")
    module = _import_file(Path(target)) if target.endswith(".py") or os.sep in target else _import(target)
    if not hasattr(module, attribute):
        names = ", ".join(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ValueError(f"{target} has no {attribute!r} (callables there: {names or 'none'})")
    factory = getattr(module, attribute)
    if not callable(factory):
        raise ValueError(f"{name}: {attribute} is a {type(factory).__name__}, not a function")
    return factory


def factory_kwargs(factory: Callable[..., Any], request: ModelRequest) -> dict[str, Any]:
    """The keyword arguments the factory takes: overrides given, context_length, attention."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        parameters = {}
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())

    def takes(name: str) -> bool:
        return takes_all or (name in parameters and parameters[name].kind in (
            inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))

    kwargs: dict[str, Any] = {}
    for key, value in request.overrides().items():
        if not takes(key):
            flag = "--" + key.replace("_", "-")
            raise ValueError(f"{request.name} takes no {key} argument: drop {flag} "
                             f"(or give the factory a {key} parameter)")
        kwargs[key] = value
    if takes("context_length"):
        kwargs["context_length"] = request.context_length
    if takes("attention"):
        kwargs["attention"] = request.attention
    elif request.attention != "naive":
        raise ValueError(f"{request.name} takes no attention argument: drop --attention "
                         f"{request.attention} (or give the factory an attention parameter)")
    return kwargs


def call_factory(factory: Callable[..., Any], kwargs: dict[str, Any], name: str,
                 device: torch.device) -> UserModel:
    """factory(**kwargs) under `device`, checked, with its model moved to the device."""
    try:
        with device:
            made = factory(**kwargs)
    except torch.OutOfMemoryError:
        raise
    except SystemExit as error:  # the user's code ending the process: a failure of this model
        raise ValueError(f"{name} called sys.exit({error.code!r}) instead of returning a UserModel") from None
    except Exception as error:  # noqa: BLE001 - the user's code: any failure is one line
        raise ValueError(f"{name} raised {type(error).__name__}: {_line(error)}") from None
    if not isinstance(made, UserModel):
        raise ValueError(f"{name} returned a {type(made).__name__}, not an lmscope.sources.UserModel"
                         "(model=..., make_batch=..., loss=...): see docs/own_model.md")
    if device.type != "meta":
        made.model.to(device)
    return made


def _import(module_name: str) -> ModuleType:
    if os.getcwd() not in sys.path:  # `lmscope` run as a script does not put the folder on sys.path
        sys.path.append(os.getcwd())
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(f"cannot import module {module_name!r}: {_line(error)} (give a module on the "
                         "Python path or a path/to/file.py)") from None
    except (Exception, SystemExit) as error:  # the user's module failed (or exited) while importing
        raise ValueError(f"importing {module_name} failed: {type(error).__name__}: {_line(error)}") from None


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise ValueError(f"model file {path} does not exist (a factory is <module or file.py>:<function>)")
    resolved = path.resolve()
    name = f"lmscope_user_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as error:  # the user's file failed (or exited) while importing
        del sys.modules[name]
        raise ValueError(f"importing {path} failed: {type(error).__name__}: {_line(error)}") from None
    return module


def _line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]
