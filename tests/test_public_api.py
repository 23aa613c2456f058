"""The public API stays where users import it: every path README.md, docs/ and examples/ show resolves.

Modules move between packages (issue 39 grouped the top-level ones by role); what users import does
not. Three guards: the names the project promises by name (the kernels, the wrappers, Probe,
UserModel, lmscope.stats ...); every `from lmscope... import ...` and every dotted `lmscope.x.y`
the docs show; and the re-export modules left at old paths, which hand out the very objects of the
modules that now hold the code, every public function and class of them.
"""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").glob("*.py"))]

PROMISED = {
    "lmscope.kernels.flash_attention": ["FlashAttentionTriton", "flash_attention"],
    "lmscope.parallel.fsdp": ["FullyShardedDP"],
    "lmscope.parallel.ddp": ["DataParallel", "NaiveDDP", "FlatDDP", "OverlapDDP", "BucketedDDP",
                             "CoalescedDDP", "TorchDDP"],
    "lmscope.parallel.sharded_optimizer": ["ShardedOptimizer"],
    "lmscope.parallel.launch": ["launch"],
    "lmscope.probe": ["Probe", "measure_step"],
    "lmscope.sources": ["UserModel"],
    "lmscope.stats": ["ratio_interval", "ratio_interval_rounds", "median_interval", "median_interval_rounds",
                      "RatioInterval", "MedianInterval"],
    "lmscope.provenance": ["provenance", "stamp", "source_identity"],
    "lmscope.fast": ["apply_to_hf_model", "fast_patch_of"],
    "lmscope.config": ["ModelConfig", "preset", "PRESETS"],
    "lmscope.cli": ["main", "app"],
}
"""What the issue, the README and docs/ promise by name (the DDP wrappers are docs/distributed.md's table)."""

SHIMS = {
    "lmscope.stats": "lmscope.records.stats",
    "lmscope.provenance": "lmscope.records.provenance",
    "lmscope.bootstrap": "lmscope.records.bootstrap",
}
"""Documented modules that moved, kept at their old path as re-exports of the module that holds the code."""

GONE_IN_HISTORY = {"lmscope.kernels.flash_hopper", "lmscope.kernels.flash_forward_tma"}
"""Modules a development log names with the commit they lived in (docs/kernels/*_notes.md)."""

FROM_IMPORT = re.compile(r"from\s+(lmscope(?:\.\w+)*)\s+import\s+([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)")
DOTTED = re.compile(r"(?<![\w./-])lmscope(?:\.[A-Za-z_]\w*)+")


def resolve(path: str) -> object:
    """The module or attribute a dotted path names: the longest importable module prefix, then
    attributes (ImportError / AttributeError when it names nothing)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            target = getattr(target, name)
        return target
    raise ImportError(path)


def shown_imports() -> list[tuple[str, str, str]]:
    """(file, module, name) of every `from lmscope... import name` the docs and examples show."""
    found = []
    for doc in DOCS:
        for module, names in FROM_IMPORT.findall(doc.read_text()):
            found += [(doc.relative_to(ROOT).as_posix(), module, n.strip()) for n in names.split(",")]
    return sorted(set(found))


def shown_paths() -> list[tuple[str, str]]:
    """(file, path) of every dotted `lmscope.x.y` the docs and examples name."""
    found = {(doc.relative_to(ROOT).as_posix(), path.rstrip("."))
             for doc in DOCS for path in DOTTED.findall(doc.read_text())}
    return sorted(p for p in found if not any(p[1] == g or p[1].startswith(g + ".") for g in GONE_IN_HISTORY))


@pytest.mark.parametrize(("module", "names"), sorted(PROMISED.items()))
def test_promised_names_import(module, names):
    imported = importlib.import_module(module)
    assert [n for n in names if not hasattr(imported, n)] == []


def test_docs_show_imports_and_paths():
    imports, paths = shown_imports(), shown_paths()
    assert ("docs/probe.md", "lmscope.probe", "Probe") in imports  # the scan reads what it should
    assert ("README.md", "lmscope.stats.ratio_interval") in paths
    broken = []
    for doc, module, name in imports:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as error:
            broken.append(f"{doc}: from {module} import {name}: {error}")
    for doc, path in paths:
        try:
            resolve(path)
        except (ImportError, AttributeError) as error:
            broken.append(f"{doc}: {path}: {error}")
    assert broken == []


def _defined_here(module: ModuleType) -> set[str]:
    return {name for name, value in vars(module).items()
            if not name.startswith("_") and (inspect.isfunction(value) or inspect.isclass(value))
            and value.__module__ == module.__name__}


@pytest.mark.parametrize(("old", "new"), sorted(SHIMS.items()))
def test_reexports_hand_out_the_moved_objects(old, new):
    shim, home = importlib.import_module(old), importlib.import_module(new)
    assert sorted(shim.__all__) == sorted(set(shim.__all__))
    assert [n for n in shim.__all__ if getattr(shim, n) is not getattr(home, n)] == []
    assert sorted(_defined_here(home) - set(shim.__all__)) == []


def test_console_script_resolves():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["lmscope"].partition(":")
    assert callable(getattr(importlib.import_module(module), function))
