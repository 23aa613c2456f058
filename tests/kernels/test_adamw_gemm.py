"""AdamW fused into the weight-gradient GEMM against its float64 reference and FusedAdamW.

Without CUDA the kernel runs in Triton's interpreter (`test_adamw_gemm_in_interpreter` reruns
this file in a TRITON_INTERPRET=1 child; the tests below skip in the parent).
"""

from __future__ import annotations

import pytest
import torch
from triton_child import module_under_test, rerun_in_interpreter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SETTINGS = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def test_adamw_gemm_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(scope="module")
def ag():
    return module_under_test("lmscope.kernels.adamw_gemm", "test_adamw_gemm_in_interpreter")


def _segments(ag, rows: list[int], n: int, gen: torch.Generator, shadow_dtype=None):
    segments = []
    for r in rows:
        param = torch.randn(r, n, generator=gen).to(DEVICE)
        exp_avg = (torch.randn(r, n, generator=gen) * 0.1).to(DEVICE)
        exp_avg_sq = (torch.rand(r, n, generator=gen) * 0.01).to(DEVICE)
        step = torch.tensor(4.0, device=DEVICE)
        shadow = torch.empty(r, n, dtype=shadow_dtype, device=DEVICE) if shadow_dtype else None
        segments.append(ag.Segment(param, exp_avg, exp_avg_sq, step, shadow))
    return segments


def _copy(ag, segments):
    return [ag.Segment(s.param.clone(), s.exp_avg.clone(), s.exp_avg_sq.clone(), s.step.clone(),
                       None if s.shadow is None else s.shadow.clone()) for s in segments]


@pytest.mark.parametrize(("rows", "n", "tokens"), [([37], 23, 29), ([19, 5, 33], 41, 50),
                                                  ([7, 9, 11, 13], 17, 3)])
def test_fp32_matches_the_float64_reference(ag, rows, n, tokens) -> None:
    gen = torch.Generator().manual_seed(sum(rows) + n)
    grad_out = torch.randn(tokens, sum(rows), generator=gen).to(DEVICE)
    x = torch.randn(tokens, n, generator=gen).to(DEVICE)
    ours = _segments(ag, rows, n, gen)
    want = _copy(ag, ours)
    ag.adamw_gemm_step(grad_out, x, ours, step_offset=1.0, **SETTINGS)
    ag.adamw_gemm_reference(grad_out, x, want, step_offset=1.0, **SETTINGS)
    for a, b in zip(ours, want, strict=True):
        for name in ("param", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6)
        assert a.step.item() == 4.0  # the count is the caller's to advance


def test_bf16_inputs_write_the_shadow_and_match_the_reference(ag) -> None:
    gen = torch.Generator().manual_seed(7)
    rows, n, tokens = [24, 40], 33, 70
    grad_out = torch.randn(tokens, sum(rows), generator=gen).to(DEVICE, torch.bfloat16)
    x = torch.randn(tokens, n, generator=gen).to(DEVICE, torch.bfloat16)
    ours = _segments(ag, rows, n, gen, shadow_dtype=torch.bfloat16)
    want = _copy(ag, ours)
    ag.adamw_gemm_step(grad_out, x, ours, step_offset=1.0, **SETTINGS)
    ag.adamw_gemm_reference(grad_out, x, want, step_offset=1.0, **SETTINGS)
    for a, b in zip(ours, want, strict=True):
        # fp32 accumulation of exact bf16 products: the gradients agree to fp32 rounding
        torch.testing.assert_close(a.param, b.param, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.exp_avg_sq, b.exp_avg_sq, rtol=1e-4, atol=1e-7)
        # within one bf16 step of the parameter (the interpreter rounds towards zero)
        torch.testing.assert_close(a.shadow.float(), a.param, rtol=2**-7, atol=0)


@pytest.mark.parametrize("split", [1, 2, 4])
def test_every_epilogue_split(ag, split) -> None:
    gen = torch.Generator().manual_seed(split)
    grad_out = torch.randn(19, 45, generator=gen).to(DEVICE)
    x = torch.randn(19, 37, generator=gen).to(DEVICE)
    ours = _segments(ag, [20, 25], 37, gen)
    want = _copy(ag, ours)
    config = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2, EPILOGUE_SPLIT=split, num_warps=4)
    ag.adamw_gemm_step(grad_out, x, ours, step_offset=1.0, config=config, **SETTINGS)
    ag.adamw_gemm_reference(grad_out, x, want, step_offset=1.0, **SETTINGS)
    for a, b in zip(ours, want, strict=True):
        torch.testing.assert_close(a.param, b.param, rtol=1e-5, atol=1e-6)


def test_a_column_slice_of_a_wider_gradient(ag) -> None:
    """grad_out may be a strided view (the stacked gradient's columns of one weight)."""
    gen = torch.Generator().manual_seed(11)
    wide = torch.randn(21, 50, generator=gen).to(DEVICE)
    x = torch.randn(21, 13, generator=gen).to(DEVICE)
    ours = _segments(ag, [17], 13, gen)
    want = _copy(ag, ours)
    ag.adamw_gemm_step(wide[:, 30:47], x, ours, step_offset=0.0, **SETTINGS)
    ag.adamw_gemm_reference(wide[:, 30:47].contiguous(), x, want, step_offset=0.0, **SETTINGS)
    torch.testing.assert_close(ours[0].param, want[0].param, rtol=1e-5, atol=1e-6)


def test_bad_shapes_are_refused(ag) -> None:
    gen = torch.Generator().manual_seed(1)
    seg = _segments(ag, [8], 4, gen)
    x = torch.zeros(5, 4, device=DEVICE)
    with pytest.raises(ValueError, match="rows in all"):
        ag.adamw_gemm_step(torch.zeros(5, 9, device=DEVICE), x, seg, step_offset=1.0, **SETTINGS)
    with pytest.raises(ValueError, match="share T"):
        ag.adamw_gemm_step(torch.zeros(6, 8, device=DEVICE), x, seg, step_offset=1.0, **SETTINGS)
    with pytest.raises(ValueError, match="bf16, fp16 or fp32"):
        ag.adamw_gemm_step(torch.zeros(5, 8, device=DEVICE, dtype=torch.bfloat16), x, seg,
                           step_offset=1.0, **SETTINGS)
