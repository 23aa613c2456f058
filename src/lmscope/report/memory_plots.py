"""Views of memory snapshots: the active-memory timeline PNG and the top-allocations table.

The timeline is drawn offline from a snapshot (no upload, no browser): total active memory over
the trace's alloc/free events, what was allocated before the step as the floor, the allocations
of the largest sizes as bands stacked in allocation order (a band sinks when one below it is
freed, as in pytorch.org/memory_viz), and the phases marked. Uses matplotlib's object API with the
Agg canvas, so it needs no display and changes no global backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from lmscope.measure.memory import AllocationGroup, Block, Timeline, site, top_allocations
from lmscope.records.results import Record
from lmscope.report import console

GIB = 2**30
MIB = 2**20
MAX_BANDS = 400
"""Most allocations drawn as bands (largest first); the rest are the grey area."""


def band_groups(timeline: Timeline, groups: int = 6) -> dict[AllocationGroup, list[Block]]:
    """The largest allocation groups (size, site) of the trace and their blocks, at most MAX_BANDS."""
    chosen = top_allocations(timeline, groups)
    keys = {(g.size, g.site): g for g in chosen}
    bands: dict[AllocationGroup, list[Block]] = {g: [] for g in chosen}
    drawn = 0
    for block in sorted((b for b in timeline.blocks if b.start >= 0), key=lambda b: (-b.size, b.start)):
        group = keys.get((block.size, site(block.frames)))
        if group is not None and drawn < MAX_BANDS:
            bands[group].append(block)
            drawn += 1
    return bands


def _offsets(timeline: Timeline, block: Block, starts: np.ndarray, ends: np.ndarray,
             sizes: np.ndarray) -> np.ndarray:
    """Bytes stacked below `block` at each event of its life: blocks allocated before it, still alive."""
    below = starts < block.start
    delta = np.zeros(timeline.events + 1, dtype=np.int64)
    np.add.at(delta, np.maximum(starts[below], 0), sizes[below])
    np.add.at(delta, ends[below], -sizes[below])
    return np.cumsum(delta)[block.start:block.end]


def plot_timeline(timeline: Timeline, path: Path, *, title: str, groups: int = 6, baseline: int = 0) -> Path:
    """Write the active-memory timeline of `timeline` to `path` (PNG).

    `baseline`: bytes the process held before the point (`MemoryMeter.baseline_allocated`), drawn
    as a dotted line when above 0: the snapshot is the allocator's whole state, the point's own
    bytes are what lies above it.
    """
    if timeline.events == 0:
        raise ValueError("the snapshot's trace holds no alloc/free events: record a step before dumping")
    x = np.arange(timeline.events)
    total = timeline.active() / GIB
    starts = np.array([b.start for b in timeline.blocks], dtype=np.int64)
    ends = np.array([b.end for b in timeline.blocks], dtype=np.int64)
    sizes = np.array([b.size for b in timeline.blocks], dtype=np.int64)
    before = [b for b in timeline.blocks if b.start < 0]
    floor = np.zeros(timeline.events + 1, dtype=np.int64)
    for block in before:
        floor[0] += block.size
        floor[block.end] -= block.size
    floor = np.cumsum(floor)[: timeline.events] / GIB

    figure = Figure(figsize=(11, 6.5), layout="constrained")
    ax = figure.subplots()
    ax.fill_between(x, 0, floor, color="#b0b0b0", linewidth=0, step="post",
                    label="allocated before the step")
    ax.fill_between(x, floor, total, color="#dcdcdc", linewidth=0, step="post", label="other allocations")
    for index, (group, blocks) in enumerate(band_groups(timeline, groups).items()):
        label = f"{group.size / MIB:,.1f} MiB x{group.count}: {group.site}"
        for block in blocks:
            base = _offsets(timeline, block, starts, ends, sizes) / GIB
            ax.fill_between(x[block.start:block.end], base, base + block.size / GIB, color=_color(index),
                            linewidth=0, step="post", label=label)
            label = None
    if baseline > 0:
        ax.axhline(baseline / GIB, color="black", linewidth=1.0, linestyle=":",
                   label="held by the process before the point")
    _mark_phases(ax, timeline, float(total.max()))
    ax.set_xlim(0, max(timeline.events - 1, 1))
    ax.set_ylim(0, float(total.max()) * 1.12 or 1.0)
    ax.set_xlabel("allocator events (alloc / free), in order")
    ax.set_ylabel("active memory (GiB)")
    ax.set_title(title, fontsize=10)
    figure.legend(loc="outside lower center", ncol=2, fontsize=7, frameon=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def _mark_phases(ax: Axes, timeline: Timeline, top: float) -> None:
    edges = [at for at, _ in timeline.boundaries] + [timeline.events]
    for (at, name), end in zip(timeline.boundaries, edges[1:], strict=False):
        ax.axvline(at, color="black", linewidth=0.8, linestyle="--")
        if name != "after" and end > at:
            ax.text((at + end) / 2, top * 1.05, name, ha="center", va="center", fontsize=8)


def show_top_allocations(records: Sequence[Record]) -> None:
    """Print each point's largest allocations (size, count, where) after the sweep's table."""
    for record in records:
        if record.get("snapshot_error"):
            console.say(f"snapshot of {record.get('size')} ctx {record.get('context_length')} "
                        f"{record.get('mode')} {record.get('precision')} failed: {record['snapshot_error']}")
        top = record.get("top_allocations") or []
        if not top:
            continue
        title = (f"largest allocations: {record.get('size')} ctx {record.get('context_length')} "
                 f"{record.get('mode')} {record.get('precision')} {record.get('attention')}"
                 f" checkpoint={record.get('checkpoint')}")
        rows = [[item["size_mib"], item["count"], item["phase"], item["site"]] for item in top]
        console.show_table((["size_mib", "count", "phase", "first frame in lmscope / user code"], rows),
                           title=title)
        for key, what in (("snapshot_path", "snapshot (pytorch.org/memory_viz)"),
                          ("timeline_png", "timeline")):
            if record.get(key):
                console.say(f"  {what}: {record[key]}")


def show_saved_activations(records: Sequence[Record]) -> None:
    """Print each `--activations` point's saved bytes per block and per op, and its peak's breakdown."""
    for record in records:
        blocks = record.get("saved_by_block") or []
        if not blocks:
            continue
        point = (f"{record.get('size')} ctx {record.get('context_length')} {record.get('mode')} "
                 f"{record.get('precision')} {record.get('attention')} checkpoint={record.get('checkpoint')}")
        grads = {g["block"]: g["grad_mib"] for g in record.get("gradients_by_block") or []}
        header = ["block", "saved_mib", "predicted_mib", "error_pct", "grad_mib"]
        rows = [[b["block"], b["saved_mib"], b.get("predicted_mib"), b.get("error_pct"),
                 grads.get(b["block"])] for b in blocks]
        console.show_table((header, rows), title=f"saved for backward, by block: {point}")
        ops = record.get("saved_by_op") or []
        console.show_table((["op (autograd node reading it)", "saved_mib", "share_pct"],
                            [[o["op"], o["saved_mib"], o["share_pct"]] for o in ops]),
                           title="saved for backward, top ops")
        parts = [k for k in record if k.startswith("breakdown_") and k != "breakdown_peak_gib"]
        rows = [[k.removeprefix("breakdown_").removesuffix("_gib"), record[k]] for k in parts]
        rows.append(["= step peak", record.get("breakdown_peak_gib")])
        console.show_table((["part", "gib"], rows), title="the step's peak, by part")
