"""Line styles for plots with many series: no two lines alike.

matplotlib's default cycle has 10 colours and repeats them from the 11th line on, so a plot of
12 series (3 modes x 4 contexts) draws pairs of lines a reader cannot tell apart.
"""

from __future__ import annotations

from typing import Any


def series_styles(count: int) -> list[dict[str, Any]]:
    """Keyword arguments of `Axes.plot` for `count` series, no two alike: tab10's colours up to 10
    series, tab20's up to 20, then the same colours again with another marker and dash."""
    from matplotlib import colormaps  # imported when a plot is drawn

    palette = colormaps["tab10" if count <= 10 else "tab20"]
    size = palette.N
    markers, dashes = "os^D", ("-", "--", ":", "-.")
    return [{"color": palette(i % size), "marker": markers[i // size % 4], "ls": dashes[i // size % 4]}
            for i in range(count)]
