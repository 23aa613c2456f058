"""FullyShardedDP on one GPU (world size 1, NCCL): the fast path with checkpointing trains like the
unsharded fast model (fp32: the same numbers; bf16: close, finite, and the gathers run on a side stream)."""

from __future__ import annotations

import copy

import pytest
import torch

from lmscope.config import ModelConfig
from lmscope.model.checkpointing import apply_checkpointing
from lmscope.model.fast_transformer import FastTransformerLM
from lmscope.parallel.fsdp import FullyShardedDP
from lmscope.parallel.launch import RankContext, launch

pytestmark = pytest.mark.gpu
CONFIG = ModelConfig(vocab_size=1000, context_length=256, d_model=256, d_ff=704, num_layers=3, num_heads=4)


def _losses(ctx: RankContext, dtype: torch.dtype | None) -> tuple[list[float], list[float]]:
    torch.manual_seed(0)
    with ctx.device:
        model = FastTransformerLM(CONFIG, attention="flash")
    reference = copy.deepcopy(model)
    apply_checkpointing(model, "block")
    wrapped = FullyShardedDP(model, param_dtype=dtype)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (wrapped, reference)]
    tokens, targets = (torch.randint(0, CONFIG.vocab_size, (2, 256), device=ctx.device) for _ in range(2))
    out: tuple[list[float], list[float]] = ([], [])
    for _ in range(3):
        for net, optimizer, losses in zip((wrapped, reference), optimizers, out, strict=True):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype is not None):
                loss = net(tokens, targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_fast_checkpointed_fsdp_trains_like_the_unsharded_fast_model(dtype):
    ours, reference = launch(_losses, dtype, nproc=1, backend="nccl", timeout_s=300)
    tolerance = 1e-5 if dtype is None else 2e-2
    for a, b in zip(ours, reference, strict=True):
        assert abs(a - b) <= tolerance * abs(b), (ours, reference)
    assert ours[-1] < ours[0]
