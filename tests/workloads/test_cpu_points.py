"""lmscope's Triton attention asked for on the CPU is refused before a sweep starts (exit 2)."""

from __future__ import annotations

import pytest
import torch

from lmscope.cli import main, sweep
from lmscope.workloads.cpu_points import refuse_triton_attention_on_cpu, runs_on_cpu


def _never_run(*args, **kwargs):
    raise AssertionError("a refused point must not reach the sweep")


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_bench_flash_on_the_cpu_is_refused_up_front(device, capsys, monkeypatch, tmp_path):
    if device == "auto" and torch.cuda.is_available():
        pytest.skip("auto is the GPU here")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(sweep, "run_sweep", _never_run)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--attention", "naive,flash", "--device", device, "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--attention flash runs lmscope's Triton kernels, which need a CUDA GPU" in err
    assert not (tmp_path / "r.jsonl").exists() or not (tmp_path / "r.jsonl").read_text()


def test_the_interpreter_and_other_backends_pass(monkeypatch):
    naive = {"size": "tiny", "attention": "naive", "device": "cpu"}
    flash = {**naive, "attention": "flash"}
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    refuse_triton_attention_on_cpu([naive, {**naive, "attention": "flash-torch"}, {**flash, "fast": True},
                                    {**flash, "device": "cuda:0"}])
    with pytest.raises(ValueError, match="flash-torch"):
        refuse_triton_attention_on_cpu([naive, flash])
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    refuse_triton_attention_on_cpu([flash])
    assert runs_on_cpu("cpu") and not runs_on_cpu("cuda:0")
    assert runs_on_cpu("auto") == (not torch.cuda.is_available())
