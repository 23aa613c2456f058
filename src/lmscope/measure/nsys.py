"""Nsight Systems: the `nsys profile` command that captures the measured steps, and `nsys stats` CSV.

The capture uses `--capture-range=cudaProfilerApi`: the workload, started with
LMSCOPE_NSYS_CAPTURE=1, runs its warm-up outside the capture and calls
torch.cuda.profiler.start()/stop() around the measured steps, each in the same `step`,
`forward`, `backward`, `optimizer` and `attention/*` NVTX ranges the torch.profiler path uses.
`nsys stats --format csv` then writes `<base>_cuda_gpu_kern_sum.csv` and `<base>_nvtx_sum.csv`,
which parse into the same KernelRow as a torch.profiler trace, plus NVTX range rows.
"""

from __future__ import annotations

import csv
import io
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lmscope.measure.kernel_categories import classify
from lmscope.measure.kernels import KernelRow

CAPTURE_ENV = "LMSCOPE_NSYS_CAPTURE"
"""Set to 1 to make the profile workload bracket its measured steps with cudaProfilerStart/Stop."""

KERN_SUM = "cuda_gpu_kern_sum"
NVTX_SUM = "nvtx_sum"
STAT_COLUMNS = ("Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)",
                "Max (ns)", "StdDev (ns)")
KERN_SUM_COLUMNS = (*STAT_COLUMNS, "Name")
NVTX_SUM_COLUMNS = (*STAT_COLUMNS, "Style", "Range")
"""Column headers exactly as `nsys stats --format csv` writes them."""


def profile_command(program: list[str], output: Path) -> list[str]:
    """`nsys profile` of `program`, recording CUDA and NVTX only inside the cudaProfilerApi range."""
    return [
        "nsys", "profile", "--trace=cuda,nvtx", "--capture-range=cudaProfilerApi",
        "--capture-range-end=stop", "--force-overwrite=true", f"--output={output}", *program,
    ]


def stats_command(report: Path, output: Path) -> list[str]:
    """`nsys stats` writing the kernel and NVTX summaries as `<output>_<report>.csv`."""
    return [
        "nsys", "stats", "--report", f"{KERN_SUM},{NVTX_SUM}", "--format", "csv",
        "--force-export=true", "--output", str(output), str(report),
    ]


def shell_line(command: list[str], env: dict[str, str] | None = None) -> str:
    """The command as one line to paste into a shell, environment assignments first."""
    assignments = [f"{key}={shlex.quote(value)}" for key, value in (env or {}).items()]
    return " ".join([*assignments, shlex.join(command)])


def run_command(command: list[str], env: dict[str, str] | None = None, timeout_s: float = 900.0) -> None:
    """Run an nsys command; a failure raises RuntimeError with the end of its output."""
    try:
        done = subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{command[0]} {command[1]} ran past {timeout_s:g} s") from None
    if done.returncode:
        tail = (done.stdout + done.stderr).strip()[-800:]
        raise RuntimeError(f"{shlex.join(command[:2])} exited with {done.returncode}: {tail}")


def _rows(text: str, columns: tuple[str, ...], what: str) -> list[dict[str, str]]:
    """Rows of a CSV whose header holds `columns`; lines before the header (notices) are skipped."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip('"').startswith(columns[0])), None)
    if start is None:
        raise ValueError(f"no {what} header in this CSV: expected columns {', '.join(columns)}")
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{what} CSV lacks column(s) {', '.join(missing)}: is it `nsys stats --format csv`?")
    return [row for row in reader if any((value or "").strip() for value in row.values())]


def _number(text: str) -> float:
    return float(text.replace(",", "").strip() or 0)


def _summary_stats(row: dict[str, str]) -> dict[str, float | int]:
    """The statistics columns that every `nsys stats` summary report shares, as KernelRow fields."""
    return {
        "time_pct": _number(row["Time (%)"]), "total_ns": _number(row["Total Time (ns)"]),
        "instances": int(_number(row["Instances"])), "avg_ns": _number(row["Avg (ns)"]),
        "med_ns": _number(row["Med (ns)"]), "min_ns": _number(row["Min (ns)"]),
        "max_ns": _number(row["Max (ns)"]), "stddev_ns": _number(row["StdDev (ns)"]),
    }


def parse_kern_sum(text: str) -> list[KernelRow]:
    """KernelRows from `nsys stats --report cuda_gpu_kern_sum --format csv` output."""
    return [
        KernelRow(name=row["Name"], category=classify(row["Name"]), **_summary_stats(row))
        for row in _rows(text, KERN_SUM_COLUMNS, KERN_SUM)
    ]


@dataclass(frozen=True)
class NvtxRow:
    """One line of the NVTX range summary."""

    range: str
    """Range name; the default domain's leading ':' is dropped."""
    style: str
    time_pct: float
    total_ns: float
    instances: int
    avg_ns: float
    med_ns: float
    min_ns: float
    max_ns: float
    stddev_ns: float


def parse_nvtx_sum(text: str) -> list[NvtxRow]:
    """NvtxRows from `nsys stats --report nvtx_sum --format csv` output."""
    return [
        NvtxRow(range=row["Range"].strip().removeprefix(":"), style=row["Style"].strip(),
                **_summary_stats(row))
        for row in _rows(text, NVTX_SUM_COLUMNS, NVTX_SUM)
    ]


def read_stats(output: Path) -> tuple[list[KernelRow], list[NvtxRow]]:
    """Parse the two CSV files that `stats_command(..., output)` wrote."""
    paths = {name: Path(f"{output}_{name}.csv") for name in (KERN_SUM, NVTX_SUM)}
    for name, path in paths.items():
        if not path.exists():
            raise FileNotFoundError(f"nsys stats wrote no {name} table at {path}")
    return (parse_kern_sum(paths[KERN_SUM].read_text(encoding="utf-8")),
            parse_nvtx_sum(paths[NVTX_SUM].read_text(encoding="utf-8")))
