"""One exit-status rule for every command that runs points: 0 when each is ok or oom, else 1."""

from __future__ import annotations

import itertools

import pytest

from lmscope.cli import main, sweep
from lmscope.records.results import append_record
from lmscope.running.runner import spec_dict

MODEL = ["--size", "tiny", "--context-length", "16,24", "--device", "cpu"]
COMMANDS = {
    "bench": ["bench", *MODEL],
    "profile": ["profile", *MODEL],
    "memory": ["memory", *MODEL],
    "attention": ["attention", "--impl", "naive", "--seq-len", "16,32", "--device", "cpu", "--no-plot"],
    "comm": ["comm", "--nproc", "2", "--backend", "gloo", "--size", "1MB,2MB"],
    "ddp": ["ddp", "--size", "tiny", "--device", "cpu", "--backend", "gloo", "--strategy", "flat"],
}


def _fake_sweep(statuses):
    """A run_sweep that writes one failed row per point, cycling through `statuses`."""

    def run_sweep(workload, specs, *, out, **_):
        for spec, status in zip(specs, itertools.cycle(statuses), strict=False):
            append_record(out, {"workload": workload, **spec_dict(spec), "status": status,
                                "error": f"made up {status}"})

    return run_sweep


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("statuses", "code"), [
    (["oom"], 0), (["oom", "error"], 1), (["timeout", "oom"], 1), (["error"], 1),
])
def test_exit_status_rule(command, statuses, code, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sweep, "run_sweep", _fake_sweep(statuses))
    with pytest.raises(SystemExit) as exit_info:
        main([*COMMANDS[command], "--out", str(tmp_path / "r.jsonl")])
        raise SystemExit(0)
    assert (exit_info.value.code or 0) == code, capsys.readouterr()


def test_exit_status_of_records():
    assert sweep.exit_status([{"status": "ok"}, {"status": "oom"}]) == 0
    assert sweep.exit_status([{"status": "ok"}, {"status": "timeout"}]) == 1
    assert sweep.exit_status([]) == 0
