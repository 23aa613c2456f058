"""Bus bandwidth against buffer size, one line per collective and world size (matplotlib PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lmscope.records.results import Record


def plot_busbw(records: Sequence[Record], path: Path) -> Path | None:
    """Write the busbw-vs-size plot of the `ok` comm records to `path`; None when there are none."""
    rows = [r for r in records if r.get("status") == "ok" and r.get("busbw_gbps") is not None]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for row in rows:
        lines.setdefault((row["op"], row["world_size"]), []).append((row["bytes"], row["busbw_gbps"]))
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for (op, world), points in sorted(lines.items()):
        points.sort()
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                  label=f"{op}, {world} ranks")
    axes.set_xscale("log")
    axes.set_xlabel("buffer size S (bytes)")
    axes.set_ylabel("busbw (GB/s)")
    backends = sorted({str(r.get("backend_used")) for r in rows})
    devices = sorted({str(r.get("device_name")) for r in rows})
    axes.set_title(f"lmscope comm: {', '.join(backends)} on {', '.join(devices)}", fontsize=10)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
