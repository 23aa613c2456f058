"""Which lmscope modules a source file imports, read with ast (no module is run): for the layering
tests, which check that a lower package never imports a higher one.

Covers imports inside functions, relative imports, ``from lmscope import x`` and
``importlib.import_module("...")`` calls.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lmscope

SRC = Path(lmscope.__file__).parent.parent
"""The directory that holds the lmscope package."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, by absolute name, wherever the
    import is: ``import a.b`` gives a.b; ``from a import b`` gives a and a.b (b may be a module);
    relative imports are resolved against ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            found.add(origin)
            found.update(f"{origin}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.add(node.args[0].value)
    return found


def lmscope_imports_under(folder: Path) -> dict[str, set[str]]:
    """module name -> the lmscope modules it imports, for every module under `folder`."""
    out = {}
    for path in sorted(folder.rglob("*.py")):
        module = _module_name(path)
        names = imported_modules(path.read_text(), module, path.name == "__init__.py")
        out[module] = {n for n in names if n == "lmscope" or n.startswith("lmscope.")}
    return out
