"""`lmscope study` and `lmscope report` from the command line: the plan, and user errors as exit 2."""

from __future__ import annotations

import pytest

from lmscope.cli import main


def test_plan_only_prints_the_plan_and_runs_nothing(tmp_path, capsys):
    main(["study", "--plan-only", "--budget", "2m", "--device", "cpu", "--out", str(tmp_path / "s")])
    out = capsys.readouterr().out
    assert "budget 2.0 min" in out and "timing" in out and "skipped: needs 2+ GPUs (0 here)" in out
    assert "later: if time is left, else --resume" in out
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["study", "--budget", "soon", "--plan-only"], "--budget takes a duration"),
        (["study", "--device", "cuda:1", "--plan-only"], "CUDA_VISIBLE_DEVICES"),
        (["report"], "Missing argument"),
    ],
)
def test_user_errors_end_in_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_report_of_a_missing_path_is_a_user_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", str(tmp_path / "nothing")])
    assert exit_info.value.code == 2
    assert "no results at" in capsys.readouterr().err
