"""The items of a list flag ('16,32', 'fwd,bwd', 'none;every:2'): an empty item is a mistake.

`--context-length 16,,32` once ran 16 and 32 without a word; a doubled or trailing separator is
more likely a value left out than meant, so it is refused and the user says which.
"""

from __future__ import annotations


def list_items(value: str, flag: str, separator: str = ",") -> list[str]:
    """The stripped items of `value`; ValueError for no item or an empty one."""
    items = [item.strip() for item in str(value).split(separator)]
    if not any(items):
        raise ValueError(f"{flag} needs at least one value")
    if not all(items):
        raise ValueError(f"{flag} {value!r} has an empty item: separate values by a single "
                         f"{separator!r}, e.g. {flag} a{separator}b")
    return items
