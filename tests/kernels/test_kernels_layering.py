"""lmscope.kernels depends on no model: no module under src/lmscope/kernels imports lmscope.model.

The model imports the kernels, and the shadow-weights contract (lmscope.kernels.shadow_copies) lies
between them. The imports are read from the source with ast, so the check covers imports inside
functions, relative imports, ``from lmscope import model`` and ``importlib.import_module("...")``
calls, all without running the kernels.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import lmscope.kernels

KERNELS = Path(lmscope.kernels.__file__).parent
SRC = KERNELS.parent.parent  # the directory that holds the lmscope package


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


def _is_model(name: str) -> bool:
    return name == "lmscope.model" or name.startswith("lmscope.model.")


def kernel_imports() -> dict[str, set[str]]:
    """module name -> the lmscope modules it imports, for every module under lmscope/kernels."""
    out = {}
    for path in sorted(KERNELS.rglob("*.py")):
        module = _module_name(path)
        names = imported_modules(path.read_text(), module, path.name == "__init__.py")
        out[module] = {n for n in names if n == "lmscope" or n.startswith("lmscope.")}
    return out


def test_no_kernel_module_imports_the_model():
    imports = kernel_imports()
    # the walk saw the kernels and their lmscope imports: it cannot pass by reading nothing
    assert {"lmscope.kernels.adamw", "lmscope.kernels.flash_attention",
            "lmscope.kernels.flash_attention.triton_kernels"} <= imports.keys()  # fmt: skip
    offenders = {module: sorted(filter(_is_model, names)) for module, names in imports.items()}
    assert {module: names for module, names in offenders.items() if names} == {}
    assert "lmscope.kernels.shadow_copies" in imports["lmscope.kernels.adamw"]  # the contract


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from lmscope.model.shadow_weights import ShadowWeights", "lmscope.kernels.adamw"),
        ("import lmscope.model.attention as attention", "lmscope.kernels.adamw"),
        ("from lmscope import model", "lmscope.kernels.adamw"),
        ("from ..model import shadow_weights", "lmscope.kernels.adamw"),
        ("from ...model.shadow_weights import ShadowWeights", "lmscope.kernels.flash_attention.plan"),
        ("def f():\n    from lmscope.model import transformer\n", "lmscope.kernels.rope"),
        ("import importlib\nimportlib.import_module('lmscope.model.transformer')", "lmscope.kernels.rope"),
    ],
)
def test_the_check_sees_each_form_of_a_model_import(source: str, module: str):
    assert any(_is_model(name) for name in imported_modules(source, module))


def test_the_check_leaves_other_imports_alone():
    source = "from lmscope.kernels import flash_native\nfrom .plan import _bucket\nimport lmscope.modelling"
    names = imported_modules(source, "lmscope.kernels.flash_attention.dispatch")
    assert "lmscope.kernels.flash_attention.plan" in names
    assert not any(_is_model(name) for name in names)


def test_the_model_s_shadow_weights_keep_the_kernel_s_contract():
    """FusedAdamW writes into any ``ShadowCopies``; the model's ``ShadowWeights`` is one, and the
    optimizer announces it writes them under the attribute name the model's step hook reads."""
    from lmscope.kernels.adamw import FusedAdamW
    from lmscope.kernels.shadow_copies import WRITES_SHADOW_WEIGHTS, ShadowCopies
    from lmscope.model.shadow_weights import ShadowWeights

    weight = torch.nn.Parameter(torch.randn(3, 5))
    shadows = ShadowWeights([[weight]], torch.bfloat16)
    assert isinstance(shadows, ShadowCopies) and shadows.views[weight].shape == weight.shape
    assert not isinstance(object(), ShadowCopies)
    assert getattr(FusedAdamW([weight], shadows=lambda: shadows), WRITES_SHADOW_WEIGHTS) is True
    assert getattr(FusedAdamW([weight]), WRITES_SHADOW_WEIGHTS) is False
