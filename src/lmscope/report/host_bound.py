"""Host-bound points named under a table: their step times measure the host as much as the GPU.

A GPU row carries `host_bound` (`lmscope.measure.gpu_busy`): its GPU worked less than
HOST_BOUND_BELOW of the step. Tables show the flag as a column; this note names the points in
words under the table (also under a --compare pivot, whose cells cannot carry the column).
"""

from __future__ import annotations

from collections.abc import Sequence

from lmscope.measure.host_bound import HOST_BOUND_BELOW
from lmscope.records.results import Record
from lmscope.report.rounds import pool_rounds
from lmscope.report.tables import format_value, latest_per_point, shown_fields


def host_bound_note(records: Sequence[Record], spec_keys: Sequence[str]) -> str | None:
    """One paragraph naming the host-bound points of `records` (the latest row of each), or None."""
    latest = latest_per_point(pool_rounds(records, spec_keys), spec_keys)
    flagged = [r for r in latest if r.get("host_bound") is True]
    if not flagged:
        return None
    keys = shown_fields(latest, spec_keys) or [k for k in ("size",) if k in spec_keys]
    names = "; ".join(
        " ".join(f"{k}={format_value(r.get(k))}" for k in keys)
        + f" ({format_value(r.get('gpu_busy_share'))} busy)"
        for r in flagged
    )
    return (f"host-bound: {names}. The GPU worked less than {HOST_BOUND_BELOW:.0%} of these steps "
            "(gpu_busy_share, kernel time over the step's wall time): their times depend on the "
            "host's speed and load, not only on the GPU.")
