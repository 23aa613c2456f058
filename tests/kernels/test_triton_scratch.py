"""lmscope.kernels.triton_scratch: the allocator is scoped to the block and to its thread."""

from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("triton")

from lmscope.kernels import triton_scratch as ts  # noqa: E402


def _current():
    return ts._allocator_var().get()


@pytest.mark.skipif(ts._allocator_var() is None, reason="this Triton has no ContextVar allocator")
def test_allocator_is_set_inside_the_block_only_and_only_in_its_thread():
    before = _current()
    seen_elsewhere = []
    with ts.triton_scratch_allocator():
        assert _current() is ts._torch_scratch
        thread = threading.Thread(target=lambda: seen_elsewhere.append(_current()))
        thread.start()
        thread.join()
    assert _current() is before
    assert seen_elsewhere and seen_elsewhere[0] is not ts._torch_scratch


@pytest.mark.skipif(ts._allocator_var() is None, reason="this Triton has no ContextVar allocator")
def test_allocator_is_restored_when_the_launch_fails():
    before = _current()
    with pytest.raises(KeyError), ts.triton_scratch_allocator():
        raise KeyError("launch failed")
    assert _current() is before


def test_no_tma_reduce_off_cuda():
    assert not ts.tma_reduce_supported(torch.device("cpu"))
