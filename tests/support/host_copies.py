"""Every host copy that activation offload makes, held weakly, and a way to run without the cyclic
garbage collector: a step's copies must be freed when its backward ends, by reference counting."""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator

import pytest

from lmscope.model import offload


def record_host_copies(monkeypatch: pytest.MonkeyPatch, weak: bool = True) -> list:
    """A list that gets each `_HostCopy` made from now on in this test: a weak reference to it, or
    with weak=False the copy itself (holding one changes nothing but when its memory is freed)."""
    made: list = []
    make = offload._HostCopy.__init__

    def recording(self, *args, **kwargs) -> None:
        make(self, *args, **kwargs)
        made.append(weakref.ref(self) if weak else self)

    monkeypatch.setattr(offload._HostCopy, "__init__", recording)
    return made


def alive(made: list[weakref.ref]) -> list:
    """The recorded copies still alive."""
    return [copy for copy in (ref() for ref in made) if copy is not None]


@contextlib.contextmanager
def without_cyclic_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off inside (as it is between its runs)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
