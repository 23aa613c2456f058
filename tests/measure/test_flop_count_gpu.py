"""The FLOP counter on a GPU: SDPA's CUDA kernels and lmscope's Triton FlashAttention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmscope.accounting.flops import step_flops
from lmscope.measure.flop_count import causal_pairs, count_phases, count_step
from lmscope.workloads.step import Spec
from lmscope.workloads.train_step import TrainStep

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_sdpa_causal_by_hand(dtype: torch.dtype) -> None:
    b, h, n, d = 2, 3, 203, 64
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    state = {}
    counts = count_phases([
        ("forward", lambda: state.update(y=F.scaled_dot_product_attention(q, k, v, is_causal=True))),
        ("backward", lambda: state["y"].sum().backward()),
    ])
    square, half = 2 * b * h * n * n * 2 * d, 2 * b * h * causal_pairs(n, n) * 2 * d
    assert (counts.phases["forward"].flops, counts.phases["backward"].flops) == (half, 2 * half)
    assert counts.total_full_square == 3 * square


@pytest.mark.parametrize("attention", ["naive", "sdpa", "flash"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_small_preset_on_cuda_equals_accounting(attention: str, precision: str) -> None:
    spec = Spec(size="small", num_layers=2, attention=attention, precision=precision, mode="train-step",
                batch_size=2, context_length=509, device="cuda")
    counts = count_step(TrainStep(spec))
    assert counts.total == step_flops(spec.model_config(), 2, 509, "train-step",
                                      full_square=attention == "naive")
