"""`nsys stats` CSV ingestion (recorded fixtures) and the nsys command lines."""

from __future__ import annotations

import csv
import shlex
import shutil
from pathlib import Path

import pytest

from lmscope.measure import nsys

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nsys"
KERN = FIXTURES / "large_forward_ctx128_cuda_gpu_kern_sum.csv"
NVTX = FIXTURES / "large_forward_ctx128_nvtx_sum.csv"
STEPS = 3  # the fixture captured 3 measured steps of the large model, forward, context 128


def test_fixture_headers_are_exactly_what_nsys_writes() -> None:
    assert next(csv.reader(KERN.open())) == list(nsys.KERN_SUM_COLUMNS)
    assert next(csv.reader(NVTX.open())) == list(nsys.NVTX_SUM_COLUMNS)
    assert nsys.KERN_SUM_COLUMNS[-1] == "Name" and nsys.NVTX_SUM_COLUMNS[-2:] == ("Style", "Range")


def test_kernel_summary_parses_into_kernel_rows() -> None:
    rows = nsys.parse_kern_sum(KERN.read_text())
    raw = list(csv.DictReader(KERN.open()))
    assert len(rows) == len(raw) == 14
    top = rows[0]
    assert top.name == "ampere_sgemm_128x64_tn" and top.category == "matmul"
    assert top.total_ns == 202105972 and top.instances == 651 and top.per_step(STEPS) == 217
    assert top.avg_ns == pytest.approx(top.total_ns / top.instances, abs=0.05)
    assert top.min_ns <= top.med_ns <= top.max_ns
    assert sum(r.time_pct for r in rows) == pytest.approx(100.0, abs=0.2)  # nsys rounds to 0.1
    softmax = next(r for r in rows if "SoftMax" in r.name)
    assert softmax.category == "reduction" and softmax.per_step(STEPS) == 36
    assert "," in softmax.name  # a quoted name with commas survives whole
    categories = {r.category for r in rows}
    assert {"matmul", "elementwise", "reduction"} <= categories


def test_nvtx_summary_parses_into_range_rows() -> None:
    rows = nsys.parse_nvtx_sum(NVTX.read_text())
    by_name = {r.range: r for r in rows}
    assert set(by_name) == {"step", "forward", "attention/scores", "attention/mask", "attention/softmax",
                            "attention/output"}
    assert by_name["attention/softmax"].instances == 108 and by_name["step"].instances == STEPS
    assert all(r.style == "PushPop" for r in rows)
    assert by_name["forward"].total_ns <= by_name["step"].total_ns


def test_notice_lines_before_the_header_are_skipped_and_domain_colon_dropped() -> None:
    text = ("Generating SQLite file capture.sqlite from capture.nsys-rep\n"
            "Processing [capture.sqlite] with [/opt/nsys/reports/nvtx_sum.py]...\n\n"
            + NVTX.read_text().replace("PushPop,forward", "PushPop,:forward"))
    rows = nsys.parse_nvtx_sum(text)
    assert "forward" in {r.range for r in rows} and len(rows) == 6


def test_csv_without_the_expected_columns_is_rejected() -> None:
    with pytest.raises(ValueError, match="no cuda_gpu_kern_sum header"):
        nsys.parse_kern_sum("a,b,c\n1,2,3\n")
    broken = KERN.read_text().replace('"StdDev (ns)",', "", 1)
    with pytest.raises(ValueError, match="StdDev"):
        nsys.parse_kern_sum(broken)


def test_read_stats_finds_the_files_nsys_stats_writes(tmp_path: Path) -> None:
    base = tmp_path / "capture"
    with pytest.raises(FileNotFoundError, match="cuda_gpu_kern_sum"):
        nsys.read_stats(base)
    shutil.copy(KERN, f"{base}_cuda_gpu_kern_sum.csv")
    shutil.copy(NVTX, f"{base}_nvtx_sum.csv")
    kernels, ranges = nsys.read_stats(base)
    assert len(kernels) == 14 and len(ranges) == 6


def test_commands_capture_only_the_profiler_api_range(tmp_path: Path) -> None:
    command = nsys.profile_command(["python", "-m", "x"], tmp_path / "cap")
    assert command[:2] == ["nsys", "profile"]
    assert "--capture-range=cudaProfilerApi" in command and "--trace=cuda,nvtx" in command
    assert command[-3:] == ["python", "-m", "x"]
    stats = nsys.stats_command(tmp_path / "cap.nsys-rep", tmp_path / "cap")
    assert "cuda_gpu_kern_sum,nvtx_sum" in stats and stats[stats.index("--format") + 1] == "csv"
    line = nsys.shell_line(command, {nsys.CAPTURE_ENV: "1"})
    assert line.startswith("LMSCOPE_NSYS_CAPTURE=1 nsys profile ")
    assert shlex.split(line)[1:] == command


def test_failed_command_raises_with_its_output() -> None:
    with pytest.raises(RuntimeError, match="exited with 3"):
        nsys.run_command(["sh", "-c", "echo broken >&2; exit 3"])
