"""benchmarks/own_model/train_curves.py: its synthetic stream and its comparison row (the two runs
themselves were checked on the CPU in Triton's interpreter; see the script's docstring)."""

from __future__ import annotations

import torch
from scripts import load_script


def test_the_stream_is_fixed_and_walks_few_successors() -> None:
    module = load_script("benchmarks/own_model/train_curves.py", "own_model_train_curves")
    stream = module.token_stream(3, 2, 40, vocab=500, active=17, successors=3, seed=5)
    assert stream.shape == (3, 2, 41) and stream.dtype == torch.int64
    assert torch.equal(stream, module.token_stream(3, 2, 40, vocab=500, active=17, successors=3, seed=5))
    assert not torch.equal(stream, module.token_stream(3, 2, 40, vocab=500, active=17, successors=3, seed=6))
    assert len(stream.unique()) <= 17 and int(stream.max()) < 500
    follows: dict[int, set[int]] = {}
    for row in stream.view(-1, 41).tolist():
        for a, b in zip(row, row[1:], strict=False):
            follows.setdefault(a, set()).add(b)
    assert max(len(nexts) for nexts in follows.values()) <= 3  # each token has at most 3 successors


def test_the_comparison_row() -> None:
    module = load_script("benchmarks/own_model/train_curves.py", "own_model_train_curves")
    row = module.compare({"transformers": [5.0, 4.0, 3.0, 2.0], "lmscope fast": [5.0, 4.1, 3.0, 2.2]}, tail=2)
    assert row["tail_steps"] == 2 and row["first_loss"] == 5.0
    assert abs(row["tail_mean_transformers"] - 2.5) < 1e-12 and abs(row["tail_mean_fast"] - 2.6) < 1e-12
    assert abs(row["max_abs_difference"] - 0.2) < 1e-12
