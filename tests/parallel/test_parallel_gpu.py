"""The distributed code paths on 2 GPUs over NCCL: wrappers, sharded fused AdamW, comm and ddp points."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lmscope.accounting.comms import COLLECTIVES
from lmscope.parallel.ddp import data_parallel
from lmscope.parallel.launch import RankContext, launch
from lmscope.parallel.sharded_optimizer import ShardedOptimizer
from lmscope.workloads import collectives, ddp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]
STRATEGIES = ["naive", "flat", "overlap", "bucketed:0.01", "bucketed:100", "coalesced:0.01", "coalesced:100",
              "torch-ddp", "torch-ddp:0.01"]


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(97, 64)
        self.mix = nn.Linear(64, 64)
        self.head = nn.Linear(64, 97, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(tokens))))


def _diff(first: nn.Module, second: nn.Module) -> float:
    pairs = zip(first.parameters(), second.parameters(), strict=True)
    return max((a - b).abs().max().item() for a, b in pairs)


def _checks(ctx: RankContext, seed: int) -> list[dict[str, float]]:
    out: dict[str, float] = {}
    generator = torch.Generator(device=ctx.device)
    for strategy in STRATEGIES:
        torch.manual_seed(seed + ctx.rank)
        model = Tied().double().to(ctx.device)
        torch.manual_seed(seed)
        reference = Tied().double().to(ctx.device)
        wrapped = data_parallel(strategy, model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
        reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
        generator.manual_seed(seed + 1)
        for step in range(4):
            tokens = torch.randint(0, 97, (4, 33), device=ctx.device, generator=generator)
            mine = tokens[2 * ctx.rank: 2 * ctx.rank + 2]
            optimizer.zero_grad(set_to_none=step % 2 == 0)  # fresh gradients, then kept ones (bucket views)
            F.cross_entropy(wrapped(mine).flatten(0, 1), mine.flatten()).backward()
            wrapped.finish_gradient_synchronization()
            optimizer.step()
            reference_optimizer.zero_grad()
            F.cross_entropy(reference(tokens).flatten(0, 1), tokens.flatten()).backward()
            reference_optimizer.step()
        out[strategy] = _diff(model, reference)
        if not strategy.startswith("torch-ddp"):  # NCCL averages in the all-reduce: no divide
            out[f"{strategy} divides"] = float("divide" in wrapped.settings["average"])
    torch.manual_seed(seed)
    model = Tied().double().to(ctx.device)
    reference = copy.deepcopy(model)
    sharded = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2, fused=True)
    plain = torch.optim.AdamW(reference.parameters(), lr=1e-2, fused=True)
    for _ in range(3):
        tokens = torch.randint(0, 97, (4, 33), device=ctx.device, generator=generator)
        for net, opt in ((model, sharded), (reference, plain)):
            opt.zero_grad()
            F.cross_entropy(net(tokens).flatten(0, 1), tokens.flatten()).backward()
            opt.step()
    out["sharded"] = _diff(model, reference)
    gathered: list[dict[str, float]] = [{} for _ in range(ctx.world_size)]
    dist.all_gather_object(gathered, out)
    return gathered


def test_wrappers_and_sharded_optimizer_match_single_gpu_training(launch_seed):
    for rank in launch(_checks, launch_seed, nproc=2, backend="nccl", timeout_s=300,
                       preload=["torch._dynamo"]):
        for name, diff in rank.items():
            assert diff < 1e-10, (name, diff, launch_seed)


@pytest.mark.parametrize("op", COLLECTIVES)
def test_nccl_collective_rows(op):
    row = collectives.run_point(dict(op=op, size_mb=3.3, world_size=2, backend="nccl", warmup=2, iters=5))
    assert row["wrong"] == 0 and row["backend_used"] == "nccl"
    assert row["busbw_gbps"] > 0


def test_ddp_point_on_two_gpus():
    row = ddp.run_point(dict(size="tiny", context_length=64, batch_size=2, strategy="bucketed:1",
                             shard_optimizer=True, world_size=2, warmup=2, steps=3))
    assert row["device_type"] == "cuda" and row["backend_used"] == "nccl"
    assert row["comm_wait_ms"] >= 0 and row["predicted_comm_wait_ms"] > 0
    memory = [row[k] for k in ("init_allocated_gib", "peak_before_optimizer_gib", "peak_after_optimizer_gib")]
    assert 0 < memory[0] <= memory[1] <= memory[2]
