"""`lmscope profile` end to end on a CPU (aten ops stand in for kernels), and its nsys path."""

from __future__ import annotations

import csv
import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lmscope.accounting.flops import step_flops
from lmscope.config import preset
from lmscope.measure import nsys
from lmscope.measure.kernel_categories import CATEGORIES
from lmscope.measure.kernels import load_trace, step_spans
from lmscope.model.attention import naive_attention
from lmscope.workloads.profile import Spec, attention_flops, nsys_capture, point_slug, run_point

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nsys"
POINT = dict(size="tiny", num_layers=2, vocab_size=512, context_length=16, batch_size=2, mode="train-step",
             device="cpu", warmup=1, steps=2)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict]:
    """One train-step point profiled on the CPU: its metrics and its profile.json."""
    folder = tmp_path_factory.mktemp("profile")
    metrics = run_point({**POINT, "artifacts_dir": str(folder)})
    return metrics, json.loads(Path(metrics["profile_json_path"]).read_text())


def test_profile_writes_every_artifact(profiled: tuple[dict, dict]) -> None:
    metrics, profile = profiled
    for key in ("trace_path", "report_path", "kernels_csv_path", "profile_json_path"):
        assert Path(metrics[key]).stat().st_size > 0
    trace = load_trace(Path(metrics["trace_path"]))
    assert len(step_spans(trace)) == POINT["steps"] and not trace.on_gpu
    report = Path(metrics["report_path"]).read_text()
    for heading in ("## Launches and idle time per step", "## CPU time by category", "## Kernels: forward",
                    "## Kernels: backward", "## Kernels: optimizer", "## Kernels: step",
                    "## Attention breakdown (naive backend)", "forward pass only"):
        assert heading in report
    assert set(profile["phases"]) == {"forward", "backward", "optimizer", "step"}
    assert metrics["kernels_are"] == "cpu_ops"
    assert "GPU" not in report.split("## Full names")[0] and "gpu_busy_frac" not in metrics
    assert 0 < metrics["cpu_busy_frac"] <= 1


def test_fractions_sum_to_one_and_kernel_time_stays_below_wall_time(profiled: tuple[dict, dict]) -> None:
    metrics, profile = profiled
    assert sum(metrics[f"{c}_frac"] for c in CATEGORIES) == pytest.approx(1.0)
    assert metrics["matmul_frac"] > 0 and metrics["forward_matmul_frac"] > 0
    assert metrics["invariant_ok"] and not profile["violations"]
    for name, stats in profile["phases"].items():
        assert sum(stats["categories"].values()) == pytest.approx(1.0), name
        assert sum(k["time_pct"] for k in stats["kernels"]) == pytest.approx(100.0), name
        assert stats["busy_ms_per_step"] <= stats["wall_ms_per_step"] * 1.002 + 0.02, name
        assert stats["kernel_ms_per_step"] == pytest.approx(sum(k["total_ns"] for k in stats["kernels"])
                                                            / 1e6 / POINT["steps"])
    whole = profile["phases"]["step"]
    assert whole["wall_ms_per_step"] <= max(profile["timing"]["profiled_times_ms"]) + 1e-6
    parts = sum(profile["phases"][p]["launches_per_step"] for p in ("forward", "backward", "optimizer"))
    assert parts <= whole["launches_per_step"]


def test_overhead_is_profiled_against_unprofiled(profiled: tuple[dict, dict]) -> None:
    metrics, _ = profiled
    assert len(metrics["times_ms"]) == len(metrics["profiled_times_ms"]) == POINT["steps"]
    expected = 100 * (metrics["profiled_step_ms"] - metrics["step_ms"]) / metrics["step_ms"]
    assert metrics["overhead_pct"] == pytest.approx(expected)


def test_kernel_csv_has_full_names_and_instances_per_step(profiled: tuple[dict, dict]) -> None:
    metrics, profile = profiled
    with Path(metrics["kernels_csv_path"]).open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["phase"] for r in rows} == set(profile["phases"])
    assert len(rows) == sum(len(s["kernels"]) for s in profile["phases"].values())
    for row in rows:
        assert float(row["instances_per_step"]) == pytest.approx(int(row["instances"]) / POINT["steps"])
        assert row["name"].startswith("aten::") or row["category"] == "other"


def test_attention_breakdown_covers_every_layer(profiled: tuple[dict, dict]) -> None:
    metrics, profile = profiled
    attention = profile["attention"]
    assert attention["layers"] == attention["expected_layers"] == POINT["num_layers"]
    assert [p["part"] for p in attention["parts"]] == ["scores", "mask", "softmax", "output"]
    assert sum(p["time_share"] for p in attention["parts"]) == pytest.approx(1.0)
    scores = attention["parts"][0]
    assert scores["tflops"] == pytest.approx(scores["flops_per_layer"] / (scores["gpu_ms_per_layer"] * 1e9))
    assert metrics["softmax_flops_vs_scores"] < 1
    assert len(attention["per_layer"]) == POINT["num_layers"]


def test_attention_matmul_flops_agree_with_torch_flop_counter() -> None:
    config = preset("tiny", num_heads=2, context_length=48)
    batch, seq = 3, 37
    shape = (batch, config.num_heads, seq, config.head_dim)
    q, k, v = (torch.randn(shape, dtype=torch.float64) for _ in range(3))
    with FlopCounterMode(display=False) as counter:
        naive_attention(q, k, v)
    flops = attention_flops(config, batch, seq)
    squares = batch * config.num_heads * seq * seq
    assert flops["scores"] - squares + flops["output"] == counter.get_total_flops()
    assert flops["softmax"] == 5 * squares and flops["mask"] == 0


@pytest.mark.parametrize(("field", "value", "message"), [
    ("steps", 0, "steps must be at least 1"),
    ("warmup", -1, "warmup must be 0 or more"),
    ("artifacts_dir", " ", "artifacts_dir is empty"),
    ("mode", "inference", "unknown mode"),
])
def test_bad_spec_says_how_to_fix_it(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Spec(**{**POINT, field: value})


def test_point_slugs_are_readable_and_unique() -> None:
    a, b = Spec(**POINT), Spec(**{**POINT, "num_layers": 3})
    assert point_slug(a).startswith("tiny-ctx16-b2-train-step-fp32-naive-")
    assert point_slug(a) != point_slug(b)
    assert point_slug(a) == point_slug(Spec(**{**POINT, "artifacts_dir": "elsewhere"}))


def test_capture_mode_runs_the_steps_without_torch_profiler(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nsys.CAPTURE_ENV, "1")
    metrics = run_point({**POINT, "num_layers": 1, "mode": "forward", "warmup": 0, "steps": 2,
                         "artifacts_dir": str(tmp_path)})
    assert metrics["nsys_capture"] is True and len(metrics["times_ms"]) == 2 and metrics["step_ms"] > 0
    assert not any(tmp_path.iterdir())  # no trace, no report: nsys records this run


def test_nsys_command_is_printed_when_nsys_is_missing(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys here
    spec = Spec(**{**POINT, "artifacts_dir": str(tmp_path)})
    capture = nsys_capture(spec)
    assert not capture["ran"] and "not on the PATH" in capture["note"]
    assert capture["command"].startswith("LMSCOPE_NSYS_CAPTURE=1 nsys profile ")
    assert "--capture-range=cudaProfilerApi" in capture["command"]
    assert "-m lmscope.workloads.profile" in capture["command"]
    spec_file = Path(capture["command"].split()[-2])
    assert Spec(**json.loads(spec_file.read_text())) == spec


FAKE_NSYS = """#!/bin/sh
# Stand-in for Nsight Systems: `profile` runs the program, `stats` writes recorded CSV tables.
set -e
verb=$1; shift
if [ "$verb" = profile ]; then
  out=""
  while [ "${1#--}" != "$1" ]; do
    case "$1" in --output=*) out="${1#--output=}";; esac
    shift
  done
  [ "$LMSCOPE_NSYS_CAPTURE" = 1 ] || exit 5
  "$@"
  touch "$out.nsys-rep"
elif [ "$verb" = stats ]; then
  while [ "$1" != --output ]; do shift; done
  base=$2; report=$3
  [ -f "$report" ] || exit 6
  cp "FIXTURES/large_forward_ctx128_cuda_gpu_kern_sum.csv" "${base}_cuda_gpu_kern_sum.csv"
  cp "FIXTURES/large_forward_ctx128_nvtx_sum.csv" "${base}_nvtx_sum.csv"
fi
"""


def test_nsys_on_path_is_run_and_its_stats_ingested(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(FAKE_NSYS.replace("FIXTURES", str(FIXTURES)))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    spec = Spec(**{**POINT, "num_layers": 1, "mode": "forward", "warmup": 0, "steps": 3,
                   "artifacts_dir": str(tmp_path / "runs")})  # 3 steps, as in the recorded fixture
    capture = nsys_capture(spec, timeout_s=300)
    assert capture["ran"] and capture["step_ms"] > 0  # the workload ran in capture mode under "nsys"
    assert len(capture["kernels"]) == 14 and capture["kernels"][0]["category"] == "matmul"
    assert {r["range"] for r in capture["ranges"]} >= {"step", "forward", "attention/softmax"}
    report = Path(capture["report_path"]).read_text()
    assert "## CUDA GPU kernel summary (whole capture)" in report and "ampere_sgemm_128x64_tn" in report
    assert "| attention/softmax | 108 | 36 |" in report


def test_terminal_view_shows_the_tables_of_a_single_point(profiled: tuple[dict, dict],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from lmscope.report.profile_report import show_point_reports

    metrics, _ = profiled
    show_point_reports([{"status": "ok", **metrics}])
    shown = capsys.readouterr().out
    assert "GPU" not in shown
    for title in ("launches and idle time per step", "CPU time by category", "kernels: forward",
                  "kernels: optimizer", "largest idle gaps in a step", "attention breakdown", "report: "):
        assert title in shown


def test_a_failing_nsys_becomes_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\necho 'no CUDA device to profile' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    capture = nsys_capture(Spec(**{**POINT, "artifacts_dir": str(tmp_path)}))
    assert not capture["ran"] and "no CUDA device to profile" in capture["note"]


def test_profile_row_counts_flops_per_phase(profiled: tuple[dict, dict]) -> None:
    metrics, _ = profiled
    # naive attention's masked matmuls count the full square, above the model FLOPs (causal pairs)
    config = Spec(**POINT).model_config()
    shape = (config, POINT["batch_size"], POINT["context_length"], POINT["mode"])
    assert metrics["flops_per_step_counted"] == step_flops(*shape, full_square=True)
    assert metrics["flops_counted_error"] == pytest.approx(
        step_flops(*shape, full_square=True) / step_flops(*shape) - 1)
    assert metrics["backward_flops"] == 2 * metrics["forward_flops"]
    assert metrics["forward_tflops"] > 0 and metrics["backward_tflops"] > 0
