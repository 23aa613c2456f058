"""FullyShardedDP.update_shards_in_backward: each reduce-scatter hands its averaged gradient to
FusedAdamW, which updates the shard there, with no fp32 shard gradient; training is the same as
with the separate step. FusedAdamW is a Triton kernel: on a CPU these run in the interpreter's
child pytest (tests/support/triton_child.py), on 2 gloo ranks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_child import rerun_in_interpreter, skip_in_parent

from lmscope.config import ModelConfig
from lmscope.model.transformer import TransformerLM
from lmscope.parallel.fsdp import FullyShardedDP
from lmscope.parallel.launch import RankContext, launch

CONFIG = ModelConfig(vocab_size=61, context_length=16, d_model=24, num_layers=2, num_heads=2, d_ff=40)
"""Odd sizes: a rank's shard begins inside a parameter, and the last one ends in padding."""


def test_update_in_backward_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


def _train(ctx: RankContext, seed: int, hand_over: bool) -> dict[str, object]:
    """Three steps of FusedAdamW over the shards, with the hand-over or the separate step: the
    full state after, and whether any shard gradient existed after a backward."""
    from lmscope.kernels.adamw import FusedAdamW

    torch.manual_seed(seed)
    wrapped = FullyShardedDP(TransformerLM(CONFIG).to(ctx.device))
    optimizer = FusedAdamW(wrapped.parameters(), lr=3e-3, weight_decay=0.1, step_in_backward=hand_over)
    if hand_over:
        wrapped.update_shards_in_backward(optimizer)
    generator = torch.Generator().manual_seed(seed + 1)
    had_grads = False
    for _ in range(3):
        tokens = torch.randint(0, CONFIG.vocab_size, (ctx.world_size, 2, 9), generator=generator)[ctx.rank]
        tokens = tokens.to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        logits = wrapped(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        had_grads |= any(p.grad is not None for p in wrapped.parameters())
        optimizer.step()
    return {"state": wrapped.full_state_dict(rank0_only=False), "had_grads": had_grads,
            "settings": wrapped.settings}


def _refusals(ctx: RankContext) -> list[str]:
    """What update_shards_in_backward says to optimizers it cannot hand gradients to."""
    from lmscope.kernels.adamw import FusedAdamW

    wrapped = FullyShardedDP(TransformerLM(CONFIG))
    messages = []
    for optimizer in (torch.optim.AdamW(wrapped.parameters()), FusedAdamW(wrapped.parameters()),
                      FusedAdamW(TransformerLM(CONFIG).parameters(), step_in_backward=True)):
        try:
            wrapped.update_shards_in_backward(optimizer)
            messages.append("")
        except ValueError as error:
            messages.append(str(error))
    return messages


def _hand_over_against_separate(backend: str) -> None:
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    separate = launch(_train, seed, False, nproc=2, backend=backend, timeout_s=300)
    handed = launch(_train, seed, True, nproc=2, backend=backend, timeout_s=300)
    assert separate["had_grads"] and not handed["had_grads"]
    assert handed["settings"]["update_in_backward"] is True
    for name, value in separate["state"].items():
        torch.testing.assert_close(handed["state"][name], value, rtol=0, atol=0, msg=name)


def test_the_hand_over_trains_like_the_separate_step_with_no_shard_gradient() -> None:
    skip_in_parent("test_update_in_backward_in_interpreter")
    _hand_over_against_separate("gloo")


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_the_hand_over_on_two_gpus_updates_on_the_reduce_stream_like_the_separate_step() -> None:
    _hand_over_against_separate("nccl")


def test_an_optimizer_that_cannot_take_the_shards_is_refused() -> None:
    skip_in_parent("test_update_in_backward_in_interpreter")
    for message in launch(_refusals, nproc=2, backend="gloo", timeout_s=300):
        assert "FusedAdamW(fsdp.parameters(), step_in_backward=True)" in message, message
