"""Upper bounds on sizes, step counts and timeouts, checked before anything runs.

A value past these is no experiment anyone can run: it could only fail later, after the
workers have started (an overflow deep inside torch, a run that waits for its timeout).
"""

from __future__ import annotations

import math

MAX_SIZE = 2**31 - 1
"""Largest size (batch, sequence, model dimension, vocabulary): no bigger one fits on a device."""
MAX_STEPS = 1_000_000
"""Most warm-up or timed steps (calls) of a point: more would outlast any point's timeout."""
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""Longest timeout of a point, a week (and within what a deadline and a collective timeout hold)."""


def check_size(name: str, value: object) -> None:
    """A positive integer at most MAX_SIZE, else ValueError naming its flag."""
    flag = "--" + name.replace("_", "-")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}: pass {flag} N")
    if value > MAX_SIZE:
        raise ValueError(f"{name} {value} is too large: at most {MAX_SIZE:,} (nothing larger fits on a "
                         f"device): pass a smaller {flag}")


def check_steps(name: str, value: object, minimum: int, unit: str = "steps") -> None:
    """An integer from `minimum` to MAX_STEPS, else ValueError naming its flag."""
    flag = "--" + name.replace("_", "-")
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        least = "0 or more" if minimum == 0 else f"at least {minimum}"
        raise ValueError(f"{name} must be {least} {unit}, got {value!r}: pass {flag} N")
    if value > MAX_STEPS:
        raise ValueError(f"{name} {value} is too many {unit}: at most {MAX_STEPS:,} (more would outlast any "
                         f"timeout): pass a smaller {flag}")


def check_timeout(value: float, flag: str = "--timeout") -> None:
    """A finite number of seconds, positive and at most MAX_TIMEOUT_S."""
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{flag} must be a positive number of seconds, got {value!r}")
    if value > MAX_TIMEOUT_S:
        raise ValueError(f"{flag} {value:g} s is too long: at most {MAX_TIMEOUT_S:g} s (a week)")
