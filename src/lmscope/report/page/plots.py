"""The report's pictures as PNG bytes: step time vs size, kernel categories per phase, memory peaks,
and the existing attention and busbw plots (drawn to a temporary file and read back).

matplotlib's object API with the Agg canvas: no display, no global backend change.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullLocator

from lmscope.measure.kernel_categories import CATEGORIES, CATEGORY_LABELS
from lmscope.records.results import Record
from lmscope.report.attention_plots import plain_minor, plain_number
from lmscope.report.styles import series_styles


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def via_file(draw: Callable[[Path], Path | None]) -> bytes | None:
    """PNG bytes of a plot function that writes to a path (None when it drew nothing)."""
    with tempfile.TemporaryDirectory() as folder:
        path = draw(Path(folder) / "plot.png")
        return path.read_bytes() if path is not None else None


FEW_SIZES = 6
"""Up to this many model sizes, the x axis is labelled at each size (a log axis spanning less than
a decade would otherwise label one tick or none)."""


def step_time_figure(records: Sequence[Record], metric: str = "median_ms") -> Figure | None:
    """Step time against parameters, one line per (mode, precision, context, compile)."""
    rows = [r for r in records if r.get("status") == "ok" and r.get(metric) and r.get("parameters")]
    sizes = sorted({r["parameters"] / 1e6 for r in rows})
    if len(sizes) < 2:
        return None
    lines: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        label = f"{r.get('mode')} {r.get('precision')} ctx {r.get('context_length')}" + (
            " compiled" if r.get("compile") else ""
        )
        lines.setdefault(label, []).append((r["parameters"], r[metric]))
    figure = Figure(figsize=(8, 5), layout="constrained")
    ax = figure.subplots()
    for (label, points), style in zip(sorted(lines.items()), series_styles(len(lines)), strict=True):
        points.sort()
        ax.plot([p[0] / 1e6 for p in points], [p[1] for p in points], ms=3, label=label, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers ('300', '2'), never '2x10^0'
        axis.set_major_formatter(FuncFormatter(plain_number))
        axis.set_minor_formatter(FuncFormatter(plain_minor))
    if len(sizes) <= FEW_SIZES:
        ax.set_xticks(sizes, [plain_number(float(f"{m:.3g}")) for m in sizes])
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("parameters (millions)")
    ax.set_ylabel(f"{metric} per step")
    ax.set_title("step time vs model size", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6, ncol=2, loc="upper left", bbox_to_anchor=(1.02, 1.0))  # off the data
    return figure


def step_time_vs_size(records: Sequence[Record], metric: str = "median_ms") -> bytes | None:
    """The PNG of `step_time_figure` (None when fewer than two sizes have a time)."""
    figure = step_time_figure(records, metric)
    return _png(figure) if figure is not None else None


def stacked_categories(columns: Sequence[tuple[str, dict[str, float]]], device: str = "GPU") -> bytes | None:
    """One stacked bar per (label, {category: ms per step}): where each phase's `device` time goes
    (a GPU's kernels, a CPU's ops)."""
    if not columns:
        return None
    figure = Figure(figsize=(max(5.0, 1.1 * len(columns) + 3), 4.5), layout="constrained")
    ax = figure.subplots()
    bottoms = [0.0] * len(columns)
    for category in CATEGORIES:
        heights = [values.get(category, 0.0) or 0.0 for _, values in columns]
        if not any(heights):
            continue
        ax.bar(range(len(columns)), heights, bottom=bottoms, label=CATEGORY_LABELS.get(category, category))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(range(len(columns)), [label for label, _ in columns], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(f"{device} time per step (ms)")
    ax.set_title(f"{'op' if device == 'CPU' else 'kernel'} time by category, per phase", fontsize=10)
    ax.legend(fontsize=7)
    return _png(figure)


def memory_peaks(records: Sequence[Record]) -> bytes | None:
    """Measured vs predicted step peak against context length, one pair of lines per setting."""
    rows = [r for r in records if r.get("status") == "ok" and r.get("step_peak_gib") is not None]
    if not rows:
        return None
    lines: dict[str, list[Any]] = {}
    for r in rows:
        label = f"{r.get('size')} {r.get('mode')} {r.get('precision')} ckpt={r.get('checkpoint')}"
        lines.setdefault(label, []).append(r)
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    ax = figure.subplots()
    for index, (label, line) in enumerate(sorted(lines.items())):
        line.sort(key=lambda r: r["context_length"])
        color = f"C{index % 10}"
        ax.plot(
            [r["context_length"] for r in line],
            [r["step_peak_gib"] for r in line],
            marker="o",
            color=color,
            label=f"{label} measured",
        )
        predicted = [
            (r["context_length"], r.get("predicted_step_peak_gib"))
            for r in line
            if r.get("predicted_step_peak_gib") is not None
        ]
        if predicted:
            ax.plot(*zip(*predicted, strict=True), ls="--", color=color, label=f"{label} predicted")
    ax.set_xlabel("context length")
    ax.set_ylabel("step peak (GiB allocated)")
    ax.set_title("memory peak per context: measured (solid) vs predicted (dashed)", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=6)
    return _png(figure)
