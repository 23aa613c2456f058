"""The choices of `lmscope comm` (collectives, element types, buffer sizes), read without torch.

The command line checks its flags here before it imports the workload (torch alone takes seconds
to import), so a typo is refused at once; `lmscope.workloads.collectives.Spec` checks each point
with the same functions and maps the dtype names to torch's.
"""

from __future__ import annotations

from lmscope.accounting.comms import COLLECTIVES
from lmscope.inputs.choices import one_of

COMM_DTYPES = ("float32", "float16", "bfloat16", "float64")
"""Element types of the buffers, named as torch's dtypes."""
SIZE_UNITS = {"": 1.0, "b": 1e-6, "kb": 1e-3, "mb": 1.0, "gb": 1e3, "kib": 2**10 / 1e6,
              "mib": 2**20 / 1e6, "gib": 2**30 / 1e6}
"""Size suffix -> decimal MB (a bare number is MB)."""

check_collective = one_of("collective", COLLECTIVES)
"""Refuse a collective lmscope does not time."""
check_comm_dtype = one_of("dtype", COMM_DTYPES)
"""Refuse an element type the benchmark does not run."""


def collective_ops(ops: list[str]) -> list[str]:
    """The --op list with `all` standing for every collective, each checked."""
    expanded = list(COLLECTIVES) if ops == ["all"] else ops
    for op in expanded:
        check_collective(op)
    return expanded


def parse_size_mb(text: str) -> float:
    """'1MB' -> 1.0, '1GB' -> 1000.0, '1MiB' -> 1.048576, '10' -> 10.0 (decimal MB)."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = None
    if value is None or unit not in SIZE_UNITS or not value > 0:
        raise ValueError(f"cannot read size {text!r}: write e.g. 1MB, 10MB, 1GB or 256MiB")
    return value * SIZE_UNITS[unit]
