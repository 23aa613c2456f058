"""A factory that calls sys.exit: one line naming it, or an error row naming it; never a silent exit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lmscope.cli import main
from lmscope.runner import run_in_process

SUPPORT = Path(__file__).resolve().parents[1] / "support"


@pytest.fixture
def support_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    paths = [str(SUPPORT), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))


def _run(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
        raise SystemExit(0)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_a_factory_that_exits_while_checked_is_one_line_naming_it(capsys, support_on_path, tmp_path):
    code, _, err = _run(capsys, "bench", "--model", "own_models:exits", "--device", "cpu",
                        "--out", tmp_path / "r.jsonl")
    assert code == 2 and err.strip() == ("lmscope: error: own_models:exits called sys.exit(3) instead of "
                                         "returning a UserModel")


def test_a_factory_that_exits_in_the_worker_is_an_error_row_naming_it(capsys, support_on_path, tmp_path):
    out = tmp_path / "r.jsonl"
    code, stdout, _ = _run(capsys, "bench", "--model", "own_models:exits_on_the_device,own_models:regression",
                           "--device", "cpu", "--warmup", "1", "--steps", "1", "--out", out)
    exited, fine = (json.loads(line) for line in out.read_text().splitlines())
    assert code == 1 and exited["status"] == "error" and fine["status"] == "ok"
    assert "own_models:exits_on_the_device called sys.exit(3)" in exited["error"]
    assert "error" in stdout  # the table shows the failed point


def test_sys_exit_anywhere_in_a_point_is_an_error_row(monkeypatch):
    import lmscope.workloads.step as step

    monkeypatch.setattr(step, "run_point", lambda spec: exit(4))
    record = run_in_process("bench", {})
    assert record == {"status": "error", "error": "SystemExit: the point's code called sys.exit(4)"}
