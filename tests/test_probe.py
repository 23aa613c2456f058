"""Probe and measure_step on a CPU: phases inside the step, warm-up left out, rows for `lmscope table`."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from lmscope.cli import app
from lmscope.probe import Probe, measure_step
from lmscope.records.results import read_records

DOC = Path(__file__).parents[1] / "docs" / "probe.md"


def test_phases_add_up_to_the_step_and_warmup_is_left_out(tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    with Probe("sleepy", warmup=2, out=out, tokens_per_step=10) as probe:
        for index in range(6):
            with probe.phase("forward"):
                time.sleep(0.05 if index < 2 else 0.004)  # slow warm-up steps must not show
            with probe.phase("backward"):
                time.sleep(0.006)
            with probe.phase("backward"):  # a second range of the same name adds up
                time.sleep(0.002)
            probe.step()
    row = probe.record
    assert row["n"] == 4 and len(row["times_ms"]) == 4
    assert 4 <= row["forward_ms"] < 40 and 8 <= row["backward_ms"] < 40
    assert row["forward_ms"] + row["backward_ms"] <= row["median_ms"]
    assert max(row["times_ms"]) < 50
    assert row["tokens_per_s"] == pytest.approx(10 / (row["median_ms"] / 1e3))
    assert "peak_allocated_gib" not in row  # no allocator peak on a CPU
    assert read_records(out) == [row]
    assert row["workload"] == "probe" and row["torch"] == torch.__version__ and row["status"] == "ok"


def test_kernels_per_phase_from_a_trace(tmp_path: Path) -> None:
    a, b = torch.randn(37, 41), torch.randn(41, 29)
    with Probe(warmup=1, kernels=True, trace_path=tmp_path / "t.json") as probe:
        for _ in range(3):
            with probe.phase("forward"):
                (a @ b).relu()
            probe.step()
    row = probe.record
    assert Path(row["trace_path"]).stat().st_size > 0
    assert row["forward_launches_per_step"] >= 2  # the matmul and the relu, per recorded step
    assert row["forward_busy_ms"] > 0


def test_no_recorded_step_is_an_error() -> None:
    with pytest.raises(ValueError, match="recorded no step"), Probe(warmup=3) as probe:
        probe.step()


def test_measure_step_runs_forward_backward_optimizer(tmp_path: Path) -> None:
    model = nn.Linear(13, 7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = (torch.randn(5, 13), torch.randn(5, 7))
    before = model.weight.detach().clone()
    row = measure_step(model, batch, lambda m, b: ((m(b[0]) - b[1]) ** 2).mean(), optimizer, warmup=1,
                       steps=3, out=tmp_path / "r.jsonl")
    assert row["n"] == 3 and {"forward_ms", "backward_ms", "optimizer_ms"} <= set(row)
    assert not torch.equal(model.weight, before)  # 4 optimizer steps ran
    with pytest.raises(ValueError, match="unknown precision"):
        measure_step(model, batch, lambda m, b: m(b[0]).sum(), precision="fp8")


def test_the_documented_example_runs_and_lmscope_table_reads_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    rows = read_records(tmp_path / "runs/mlp/results.jsonl")
    assert [r["n"] for r in rows] == [5, 5] and rows[0]["label"] == "mlp"
    result = CliRunner().invoke(app, ["table", "runs/mlp/results.jsonl", "--format", "md"])
    assert result.exit_code == 0, result.output
    assert "forward_ms" in result.output and "optimizer_ms" in result.output
