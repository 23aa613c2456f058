"""What the CLI tells a user: --version, interrupt lines, and hints that name flags, not internals."""

from __future__ import annotations

import pytest
import torch

from lmscope import __version__
from lmscope.cli import main, sweep
from lmscope.planning import precision
from lmscope.records.provenance import git_state, source_hash
from lmscope.workloads.step import Spec


def _run(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
        raise SystemExit(0)
    captured = capsys.readouterr()
    return exit_info.value.code or 0, captured.out, captured.err


def test_version_prints_the_version_and_the_git_sha(capsys):
    code, out, _ = _run(capsys, "--version")
    line = out.strip()
    assert code == 0 and line.startswith(f"lmscope {__version__} (")
    sha = git_state()
    assert (f"(git {sha}," in line) if sha else ("git sha unknown" in line)
    assert f"source {source_hash()}" in line


def _interrupt(*_, **__):
    raise KeyboardInterrupt


def test_interrupt_suggests_resume_only_where_the_command_has_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(precision, "accumulate", _interrupt)
    code, _, err = _run(capsys, "precision", "accumulate")
    assert code == 130 and err.strip() == "lmscope: error: interrupted"
    monkeypatch.setattr(sweep, "run_sweep", _interrupt)
    code, _, err = _run(capsys, "bench", "--device", "cpu", "--out", str(tmp_path / "r.jsonl"))
    assert code == 130 and "rerun with --resume" in err


@pytest.mark.parametrize("fast", [False, True])
def test_flash_on_cpu_suggests_flash_torch(fast, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    spec = Spec(size="tiny", attention="flash", fast=fast, device="cpu")
    with pytest.raises(ValueError, match="flash-torch") as error:
        spec.source().build(torch.device("cpu"))
    assert "TRITON_INTERPRET" not in str(error.value) and "import" not in str(error.value)


@pytest.mark.parametrize("fast", [False, True])
def test_sdpa_cudnn_on_cpu_points_to_sdpa(fast, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # even where the fast path's kernels could run
    spec = Spec(size="tiny", attention="sdpa-cudnn", fast=fast, device="cpu")
    with pytest.raises(ValueError, match="needs a CUDA GPU: on the CPU use --attention sdpa"):
        spec.source().build(torch.device("cpu"))
