"""The FLOP counter on lmscope's Triton FlashAttention (TRITON_INTERPRET=1 child on a CPU)."""

from __future__ import annotations

import pytest
from triton_child import rerun_in_interpreter, skip_in_parent

pytest.importorskip("triton")

from lmscope.accounting.flops import step_flops  # noqa: E402
from lmscope.measure.flop_count import count_step  # noqa: E402
from lmscope.workloads.step import Spec  # noqa: E402
from lmscope.workloads.train_step import TrainStep  # noqa: E402

PARENT = "test_flop_count_flash_in_interpreter"


def test_flop_count_flash_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.mark.parametrize("mode", ["forward", "forward-backward"])
def test_flash_triton_counts_like_accounting(mode: str) -> None:
    skip_in_parent(PARENT)
    spec = Spec(size="tiny", vocab_size=97, num_layers=1, attention="flash", mode=mode, batch_size=1,
                context_length=19, device="cpu")
    counts = count_step(TrainStep(spec))
    assert counts.total == step_flops(spec.model_config(), 1, 19, mode)
    assert counts.total < counts.total_full_square
