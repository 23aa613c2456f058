"""tensors_in: every tensor in nested lists, tuples and dicts, in order; nothing else."""

from __future__ import annotations

import torch

from lmscope.model.tensor_leaves import tensors_in


def test_every_nested_tensor_in_order_and_nothing_else():
    a, b, c, d = (torch.randn(3) for _ in range(4))
    value = (a, [1, "x", None, {"k": b, "n": 2.0}], {"deep": ([c],)}, d, torch.Size([3]))
    assert [id(t) for t in tensors_in(value)] == [id(a), id(b), id(c), id(d)]
    assert list(tensors_in(a)) == [a]
    assert list(tensors_in(5)) == [] and list(tensors_in({})) == []
