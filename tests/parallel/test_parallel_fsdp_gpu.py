"""FullyShardedDP on one GPU (world size 1, NCCL): the fast path with checkpointing trains like the
unsharded fast model (fp32: the same numbers; bf16: close, finite, and the gathers run on a side stream);
the user-facing API (names, state dicts, summon, keep_fp32, fp16 with ShardedGradScaler) on CUDA."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.distributed as dist

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


def _api_on_device(ctx: RankContext) -> dict[str, object]:
    """The user-facing API on the rank's device: bf16 with fp32 norms, names and gradients, full
    state dicts on the device, freed weights, summon_full_params, then fp16 with ShardedGradScaler."""
    from lmscope.model.transformer import RMSNorm, TransformerLM
    from lmscope.parallel.sharded_grad_scaler import ShardedGradScaler

    torch.manual_seed(0)
    tokens, targets = (torch.randint(0, CONFIG.vocab_size, (2, 64), device=ctx.device) for _ in range(2))
    out: dict[str, object] = {}
    for dtype in (torch.bfloat16, torch.float16):
        with ctx.device:
            model = TransformerLM(CONFIG)
        wrapped = FullyShardedDP(model, param_dtype=dtype, keep_fp32=(RMSNorm,))
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
        scaler = ShardedGradScaler(ctx.device.type, enabled=dtype == torch.float16)
        losses = []
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(wrapped(tokens).float().flatten(0, 1), targets.flatten())
            scaler.scale(loss).backward()
            wrapped.finish_gradient_synchronization()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
        name = str(dtype).replace("torch.", "")
        out[f"{name} losses"] = losses
        if dtype is torch.bfloat16:
            grad = dict(wrapped.named_parameters())["layers.0.attn.q_proj.weight"].grad
            out["grad on device"] = grad is not None and grad.to_local().device.type == ctx.device.type
            on_device = wrapped.full_state_dict(rank0_only=False, device=ctx.device)
            on_cpu = wrapped.full_state_dict()
            out["state on device"] = all(t.device.type == ctx.device.type for t in on_device.values())
            out["same state"] = all(torch.equal(on_device[k].cpu(), v) for k, v in on_cpu.items())
            try:
                model.layers[0].ffn.w1.weight.sum()
                out["freed read"] = None
            except RuntimeError as error:
                out["freed read"] = str(error)
            with wrapped.summon_full_params():
                summoned = model.layers[0].ffn.w1.weight.cpu()
            out["summoned"] = torch.equal(summoned, on_cpu["layers.0.ffn.w1.weight"])
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fsdp_api_on_cuda():
    result = launch(_api_on_device, nproc=1, backend="nccl", timeout_s=300)
    for dtype in ("bfloat16", "float16"):
        losses = result[f"{dtype} losses"]
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], result
    assert result["grad on device"] and result["state on device"] and result["same state"], result
    assert "summon_full_params" in result["freed read"], result
    assert result["summoned"], result


TWO_GPU_CONFIG = ModelConfig(vocab_size=211, context_length=48, d_model=70, d_ff=191, num_layers=3,
                             num_heads=5)
"""Odd vocabulary and d_ff: each rank's half of a unit begins inside a parameter."""


def _two_gpu_training(ctx: RankContext, seed: int, prefetch: int, separate_reduce: bool = False) -> float:
    """fp32 FullyShardedDP on 2 GPUs (side streams, NCCL in place), two micro-batches per step,
    against one process training on both ranks' rows: the largest relative parameter error.
    `separate_reduce`: the reduce-scatters on a process group of their own."""
    from lmscope.model.transformer import TransformerLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(seed)
    with ctx.device:
        model = TransformerLM(TWO_GPU_CONFIG)
    reference = copy.deepcopy(model)
    reduce_group = dist.new_group([0, 1]) if separate_reduce else None
    wrapped = FullyShardedDP(model, prefetch=prefetch, reduce_group=reduce_group)
    adamw = dict(lr=3e-3, eps=1e-4, fused=True)
    optimizer = torch.optim.AdamW(wrapped.parameters(), **adamw)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), **adamw)
    generator = torch.Generator(device=ctx.device).manual_seed(seed + 1)

    def loss(net: torch.nn.Module, rows: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(net(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())

    for _ in range(3):
        shape = (ctx.world_size, 2, 3, 33)  # rank, micro-batch, rows, tokens
        batch = torch.randint(0, TWO_GPU_CONFIG.vocab_size, shape, device=ctx.device, generator=generator)
        optimizer.zero_grad(set_to_none=True)
        reference_optimizer.zero_grad(set_to_none=True)
        for micro in range(2):
            loss(wrapped, batch[ctx.rank, micro]).backward()
            for rank in range(ctx.world_size):
                (loss(reference, batch[rank, micro]) / ctx.world_size).backward()
        optimizer.step()
        reference_optimizer.step()
    state = wrapped.full_state_dict(rank0_only=False, device=ctx.device)
    return max(((state[n] - p.detach()).norm() / p.detach().norm()).item()
               for n, p in reference.named_parameters())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize(("prefetch", "separate_reduce"), [(0, False), (2, False), (2, True)])
def test_fsdp_on_two_gpus_trains_like_one_process(launch_seed, prefetch, separate_reduce):
    error = launch(_two_gpu_training, launch_seed, prefetch, separate_reduce, nproc=2, backend="nccl",
                   timeout_s=300)
    assert error < 1e-5
