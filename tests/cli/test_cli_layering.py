"""The command line sits on top: no module of lmscope outside lmscope/cli imports lmscope.cli
(`lmscope/__main__.py`, which starts it, aside). The study runs the commands' grids through
lmscope.inputs.grid, not through the command modules."""

from __future__ import annotations

from import_graph import SRC, imported_modules, lmscope_imports_under


def _is_cli(name: str) -> bool:
    return name == "lmscope.cli" or name.startswith("lmscope.cli.")


def test_no_module_below_the_command_line_imports_it():
    imports = lmscope_imports_under(SRC / "lmscope")
    assert {"lmscope.study.sections", "lmscope.cli.app", "lmscope.inputs.grid"} <= imports.keys()
    offenders = {module: sorted(filter(_is_cli, names)) for module, names in imports.items()
                 if not _is_cli(module) and module != "lmscope.__main__"}
    assert {module: names for module, names in offenders.items() if names} == {}


def test_the_check_sees_a_lazy_import_of_the_command_line():
    source = "def points():\n    from lmscope.cli.distributed_sweeps import ddp_points\n"
    assert any(_is_cli(name) for name in imported_modules(source, "lmscope.study.sections"))
