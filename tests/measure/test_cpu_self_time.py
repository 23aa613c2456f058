"""CPU ops as kernels by self time: nothing of a thread's op time dropped or counted twice."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from torch import nn

from lmscope.measure.cpu_self_time import op_self_times
from lmscope.measure.kernels import STEP, load_trace, phase_stats, record_trace, step_spans


def _random_tree(rng: random.Random, start: int, end: int, depth: int) -> list[tuple[int, int, str]]:
    """Properly nested op intervals inside [start, end), names drawn from working and no-work ops."""
    ops, cursor = [], start
    while depth and end - cursor > 4 and rng.random() < 0.7:
        low = rng.randint(cursor, (cursor + end) // 2)
        high = rng.randint(low + 1, end)
        ops.append((low, high, rng.choice(["aten::addmm", "aten::copy_", "aten::empty", "aten::view"])))
        ops.extend(_random_tree(rng, low, high, depth - 1))
        cursor = high
    return ops


def test_credited_time_is_the_union_of_top_level_ops_on_random_trees() -> None:
    rng = random.Random(7)
    for _ in range(50):
        ops, cursor = [], 0
        for _ in range(rng.randint(1, 5)):
            start, end = cursor + rng.randint(0, 30), cursor + rng.randint(40, 400)
            ops.append((0, "aten::linear", start, end))
            ops.extend((0, name, low, high) for low, high, name in _random_tree(rng, start, end, 4))
            cursor = end
        credited = op_self_times(ops)
        pieces = sorted(piece for op in credited for piece in op.segments)
        assert all(a[1] <= b[0] for a, b in zip(pieces, pieces[1:], strict=False))  # disjoint
        top_level = sum(end - start for thread, name, start, end in ops if name == "aten::linear")
        assert sum(op.self_ns for op in credited) == top_level


def _conv_net_step(features: int) -> tuple[nn.Module, torch.Tensor]:
    net = nn.Sequential(nn.Conv2d(3, 24, 3, padding=1), nn.BatchNorm2d(24), nn.ReLU(), nn.Flatten(),
                        nn.Linear(24 * 13 * 11, features, bias=True))
    return net, torch.randn(5, 3, 13, 11)


def test_convolution_and_biased_linear_keep_their_time_in_a_real_profile(tmp_path: Path) -> None:
    """aten::mkldnn_convolution (which allocates inside) and aten::addmm (which copies the bias in)
    used to vanish from CPU kernel tables; here they hold their time and the shares add up."""
    torch.manual_seed(0)
    net, batch = _conv_net_step(37)

    def step() -> None:
        net(batch).square().mean().backward()

    path = tmp_path / "trace.json"
    record_trace(step, steps=2, device=torch.device("cpu"), path=path)
    trace = load_trace(path)
    whole = phase_stats(trace, STEP, step_spans(trace))
    per_name: dict[str, float] = defaultdict(float)
    for row in whole.kernels:
        per_name[row.name] += row.total_ns
    convolutions = [name for name in per_name if "conv" in name and "backward" not in name.lower()]
    assert convolutions and sum(per_name[name] for name in convolutions) > 0
    assert per_name["aten::addmm"] > 0
    assert sum(row.time_pct for row in whole.kernels) == pytest.approx(100.0)
    shares = whole.as_dict()["categories"]
    assert shares["matmul"] > 0.2, shares  # convolutions and GEMMs are most of this step's work
    assert whole.kernel_ns <= whole.wall_ns and not whole.violations


def test_no_work_ops_fold_into_the_nearest_working_op_around_them_or_the_top_level_one() -> None:
    o = random.randrange(10**6)
    ops = [(1, "aten::linear", o, o + 100), (1, "aten::addmm", o + 10, o + 90),
           (1, "aten::expand", o + 20, o + 30), (1, "aten::view", o + 22, o + 24),  # folds twice
           (1, "aten::empty", o + 40, o + 60), (1, "aten::copy_", o + 45, o + 50),  # the copy keeps its own
           (1, "aten::empty", o + 200, o + 230), (1, "aten::view", o + 205, o + 215),  # top level
           (1, "aten::add", o + 300, o + 300)]  # took no time
    credited = {(op.name, op.start_ns): op for op in op_self_times(ops)}
    assert {key: op.self_ns for key, op in credited.items()} == {
        ("aten::linear", o): 20, ("aten::addmm", o + 10): 75, ("aten::copy_", o + 45): 5,
        ("aten::empty", o + 200): 30, ("aten::add", o + 300): 0}
    assert credited["aten::addmm", o + 10].segments == ((o + 10, o + 45), (o + 50, o + 90))
    assert credited["aten::add", o + 300].segments == ((o + 300, o + 300),)
