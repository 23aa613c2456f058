"""The points a sweep runs: the cartesian product of its swept flags over its fixed ones.

Every command builds its point list here, before anything is measured, so the same rule serves
the commands (cli) and the study (which runs the commands' grids section by section).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any


def expand_grid(fixed: dict[str, Any], swept: dict[str, Iterable[Any]]) -> list[dict[str, Any]]:
    """Cartesian product of the swept fields, each merged over the fixed fields, in order."""
    names = list(swept)
    return [
        {**fixed, **dict(zip(names, values, strict=True))}
        for values in itertools.product(*(list(swept[name]) for name in names))
    ]


def ddp_points(fixed: dict[str, Any], swept: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The grid of strategies x sharding x world sizes, with one single baseline per model point.

    `single` takes world size 1, no sharding and its moments on the device whatever the flags say;
    the baselines come first.
    """
    points, baselines = [], []
    for point in expand_grid(fixed, swept):
        unwrapped = {"world_size": 1, "shard_optimizer": False, "optimizer_state": "device"}
        if point["strategy"] == "single":
            point = {**point, **unwrapped}
        points.append(point)
        baselines.append({**point, "strategy": "single", **unwrapped})
    unique = {repr(sorted(p.items())): p for p in baselines + points}
    return list(unique.values())
