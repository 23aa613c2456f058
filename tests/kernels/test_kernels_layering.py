"""lmscope.kernels depends on no model: no module under src/lmscope/kernels imports lmscope.model.

The model imports the kernels, and the shadow-weights contract (lmscope.kernels.shadow_copies) lies
between them. The imports are read from the source with ast, so the check covers imports inside
functions, relative imports, ``from lmscope import model`` and ``importlib.import_module("...")``
calls, all without running the kernels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from import_graph import imported_modules, lmscope_imports_under

import lmscope.kernels

KERNELS = Path(lmscope.kernels.__file__).parent
def _is_model(name: str) -> bool:
    return name == "lmscope.model" or name.startswith("lmscope.model.")


def test_no_kernel_module_imports_the_model():
    imports = lmscope_imports_under(KERNELS)
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
