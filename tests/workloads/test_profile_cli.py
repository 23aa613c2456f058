"""`lmscope profile` on the command line: user mistakes end in one line and exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmscope.cli import main


@pytest.mark.parametrize(("flags", "message"), [
    (["--steps", "0"], "steps must be at least 1"),
    (["--mode", "inference"], "unknown mode 'inference'"),
    (["--context-length", "12x"], "--context-length takes integers"),
])
def test_bad_flags_exit_2_with_one_line(flags: list[str], message: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["profile", "--size", "tiny", "--device", "cpu", "--out", str(tmp_path / "r.jsonl"), *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r.jsonl").exists()
