"""Block treatments under FullyShardedDP on 2 gloo ranks: full, selective (torch's selective
checkpointing on the eager blocks) and offload train exactly like the untreated model, and
offloading leaves FSDP's gathered parameters alone (it moves activations only)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lmscope.config import ModelConfig
from lmscope.model import checkpointing
from lmscope.model.checkpointing import apply_checkpointing
from lmscope.model.offload import OffloadFrame
from lmscope.model.transformer import TransformerLM
from lmscope.parallel.fsdp import FullyShardedDP
from lmscope.parallel.launch import RankContext, launch

CONFIG = ModelConfig(vocab_size=37, context_length=16, d_model=10, d_ff=23, num_layers=3, num_heads=1)
POLICIES = ("none", "blocks:0+selective:1-2+offload", "block+offload")


def _train(ctx: RankContext, seed: int) -> list[dict[str, list[float]]]:
    out: dict[str, list[float]] = {}
    taken: list[tuple[int, ...]] = []
    takes = OffloadFrame.takes

    def spy(frame: OffloadFrame, tensor: torch.Tensor) -> bool:
        if takes(frame, tensor):
            taken.append(tuple(tensor.shape))
            return True
        return False

    OffloadFrame.takes = spy  # this rank's process only
    for policy in POLICIES:
        if "selective" in policy and not checkpointing._SAC_TAKES_HOOKS:
            continue
        torch.manual_seed(seed)
        model = TransformerLM(CONFIG)
        apply_checkpointing(model, policy)
        wrapped = FullyShardedDP(model)
        optimizer = torch.optim.AdamW(wrapped.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(seed + 1 + ctx.rank)
        losses = []
        for _ in range(2):
            tokens = torch.randint(0, CONFIG.vocab_size, (2, 9), generator=generator)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(wrapped(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten())
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        state = wrapped.full_state_dict()
        dist.barrier()
        weights = [float(sum(v.double().sum() for v in state.values()))] if ctx.rank == 0 else []
        out[policy] = losses + weights
    out["leading dims offloaded"] = sorted({shape[0] for shape in taken})
    gathered: list[dict[str, list[float]]] = [{} for _ in range(ctx.world_size)]
    dist.all_gather_object(gathered, out)
    return gathered


@pytest.fixture(scope="module")
def ranks(launch_seed: int) -> list[dict[str, list[float]]]:
    return launch(_train, launch_seed, nproc=2, backend="gloo", timeout_s=300, preload=["torch._dynamo"])


def test_treated_blocks_train_exactly_like_untreated_ones(ranks):
    for rank in ranks:
        reference = rank["none"]
        treated = [policy for policy in POLICIES[1:] if policy in rank]
        assert treated, "no treated policy ran"
        for policy in treated:
            assert rank[policy] == reference, policy  # losses (and rank 0's final weights' sum), bit for bit
        assert rank["leading dims offloaded"] == [2, 18]  # batch, or batch * seq: activations only
