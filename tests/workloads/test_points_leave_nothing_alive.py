"""A point leaves no tensor alive once it returns: no cache, registry or cycle keeps its memory,
so the next point in the same process starts from what the process held before (CPU, tiny)."""

from __future__ import annotations

import gc

import pytest

from lmscope.measure.memory import LiveTensorBytes
from lmscope.workloads import attention, memory, step

TINY = {"size": "tiny", "device": "cpu", "batch_size": 2, "context_length": 16, "mode": "train-step"}


def _points(tmp_path):
    return {
        "memory": lambda: memory.run_point({**TINY, "precision": "bf16", "activations": True,
                                            "warmup": 1, "steps": 1, "artifacts_dir": str(tmp_path)}),
        "memory-checkpointed": lambda: memory.run_point({**TINY, "precision": "fp32", "checkpoint": "block",
                                                         "warmup": 1, "steps": 1, "snapshot": False,
                                                         "artifacts_dir": str(tmp_path)}),
        "bench": lambda: step.run_point({**TINY, "precision": "bf16", "warmup": 1, "steps": 2,
                                         "target_ci": 0.0}),  # exactly the steps asked
        "attention": lambda: attention.run_point({"impl": "naive", "batch": 1, "seq_len": 32, "head_dim": 8,
                                                  "cpu_steps": 1, "device": "cpu"}),
    }


@pytest.mark.parametrize("name", [pytest.param("memory", marks=pytest.mark.slow), "memory-checkpointed",
                                  pytest.param("bench", marks=pytest.mark.slow), "attention"])
def test_no_tensor_a_point_made_outlives_it(name, tmp_path):
    run = _points(tmp_path)[name]
    watch = LiveTensorBytes()  # outside the point's own meter: it sees every storage the point makes
    with watch:
        record = run()
    assert record and watch.peak > 0
    del record
    gc.collect()
    assert (watch.current, len(watch._sizes)) == (0, 0)
