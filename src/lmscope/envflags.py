"""On/off switches read from environment variables (lmscope's LMSCOPE_* knobs, TRITON_INTERPRET)."""

from __future__ import annotations

import os

_OFF = frozenset(("", "0", "false", "no", "off"))


def env_flag(name: str, default: bool = False) -> bool:
    """``name``'s value as a switch: unset gives ``default``; empty, 0, false, no or off (any
    case, surrounding spaces ignored) is off; anything else is on."""
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in _OFF
