"""A stand-in for the CUDA caching allocator's statistics, to test memory readings without a GPU.

`FakeAllocator.install(monkeypatch)` replaces torch.cuda's memory_allocated, max_memory_allocated,
memory_reserved, max_memory_reserved, reset_peak_memory_stats, empty_cache and synchronize with
its own counters. `held` bytes stand for what the process allocated before a point (another
model, a test's leftovers); `cached` for free room the allocator keeps reserved on top.
"""

from __future__ import annotations

import torch


class FakeAllocator:
    """Allocated, requested and reserved byte counters with peaks, as torch.cuda reports them."""

    def __init__(self, held: int = 0, cached: int = 0) -> None:
        self.allocated = held
        self.requested = held
        self.reserved = held + cached
        self.max_allocated = self.allocated
        self.max_requested = self.requested
        self.max_reserved = self.reserved
        self.emptied = 0

    def alloc(self, size: int, requested: int | None = None) -> None:
        """A block of `size` bytes for a tensor of `requested` (default: the same)."""
        self.allocated += size
        self.requested += size if requested is None else requested
        self.reserved = max(self.reserved, self.allocated)
        self.max_allocated = max(self.max_allocated, self.allocated)
        self.max_requested = max(self.max_requested, self.requested)
        self.max_reserved = max(self.max_reserved, self.reserved)

    def free(self, size: int, requested: int | None = None) -> None:
        self.allocated -= size
        self.requested -= size if requested is None else requested

    def empty_cache(self) -> None:
        self.emptied += 1
        self.reserved = self.allocated

    def reset_peaks(self) -> None:
        self.max_allocated = self.allocated
        self.max_requested = self.requested
        self.max_reserved = self.reserved

    def install(self, monkeypatch) -> FakeAllocator:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.max_allocated)
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: self.reserved)
        monkeypatch.setattr(cuda, "max_memory_reserved", lambda device=None: self.max_reserved)
        monkeypatch.setattr(cuda, "memory_stats",
                            lambda device=None: {"requested_bytes.all.peak": self.max_requested})
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: self.reset_peaks())
        monkeypatch.setattr(cuda, "empty_cache", self.empty_cache)
        monkeypatch.setattr(cuda, "synchronize", lambda device=None: None)
        return self
