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


BELOW_THE_RUNNER = ("workloads", "parallel", "model", "kernels", "measure")
"""DESIGN.md's order: cli -> runner -> workloads -> (model, kernels, measure, parallel)."""


def test_nothing_the_runner_runs_imports_the_runner():
    imports = lmscope_imports_under(SRC / "lmscope")
    below = {module: names for module, names in imports.items()
             if module.split(".")[1:2] and module.split(".")[1] in BELOW_THE_RUNNER}
    assert "lmscope.workloads.ddp" in below and "lmscope.parallel.launch" in below
    offenders = {module: sorted(n for n in names if n.partition(".")[2].startswith("running"))
                 for module, names in below.items()}
    assert {module: names for module, names in offenders.items() if names} == {}
