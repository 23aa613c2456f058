"""lmscope's fast path on a transformers Llama under FullyShardedDP on 2 gloo ranks, against the
unpatched, unsharded model trained on the whole batch.

The fused forwards read the weights from the modules at call time, where FSDP has put the
gathered ones, so sharding changes nothing but the summation order. The ranks run on the CPU
with the kernels in Triton's interpreter (they take TRITON_INTERPRET=1 from the launcher's
environment and import the kernels themselves), also on a host with a GPU; attention is
flash-torch.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from triton_child import run_interpreted

from lmscope.parallel.launch import RankContext, launch

pytest.importorskip("transformers")

STEPS = 2
PER_RANK = 2
SEQ = 7
_THIS = "test_fast_llama_under_fsdp_trains_like_the_unpatched_unsharded_model"
ADAMW = dict(lr=3e-3, weight_decay=0.01, betas=(0.8, 0.95), eps=1e-4)
"""eps above fp32 rounding of the gradients (see tests/parallel/test_parallel_fsdp.py)."""


def _model(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=37, tie_word_embeddings=True,
                         max_position_embeddings=16)
    torch.manual_seed(seed)
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa").float()


def _fused_loss(model, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens, shift_labels=targets).loss  # the patched model's fused head


def _logits_loss(model, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(input_ids=tokens).logits.float().flatten(0, 1), targets.flatten())


def _train(model, loss_fn, batches: list, rows: slice) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for tokens, targets in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model, tokens[rows], targets[rows])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _sharded_against_reference(ctx: RankContext, seed: int) -> dict[str, object]:
    from lmscope.model.hf_fast import apply_to_hf_model
    from lmscope.parallel.fsdp import FullyShardedDP

    model = _model(seed)
    reference = copy.deepcopy(model)
    patch = apply_to_hf_model(model, attention="flash-torch")
    generator = torch.Generator().manual_seed(seed + 1)
    shape = (ctx.world_size * PER_RANK, SEQ)
    batches = [tuple(torch.randint(0, 37, shape, generator=generator) for _ in range(2))
               for _ in range(STEPS)]
    wrapped = FullyShardedDP(model)
    _train(wrapped, _fused_loss, batches, slice(ctx.rank * PER_RANK, (ctx.rank + 1) * PER_RANK))
    state = wrapped.full_state_dict()
    out: dict[str, object] = {"replaced": patch.summary()}
    if ctx.rank == 0:
        # the mean over the whole batch is the mean of the ranks' means
        _train(reference, _logits_loss, batches, slice(None))
        out["error"] = max(((state[n].double() - p.double()).norm() / p.double().norm()).item()
                           for n, p in reference.state_dict().items())
        out["moved"] = min((p.detach() - q.detach()).abs().max().item()
                           for p, q in zip(reference.parameters(), _model(seed).parameters(), strict=True))
    return out


def test_fast_llama_under_fsdp_trains_like_the_unpatched_unsharded_model(launch_seed) -> None:
    """Run in a TRITON_INTERPRET=1 child pytest: the local ranks fork from a forkserver that the
    first launch of a process starts, and one started by an earlier test of this process may
    hold the kernels imported without the interpreter."""
    if os.environ.get("LMSCOPE_TRITON_CHILD") != "1":
        child = run_interpreted(["-m", "pytest", "-q", "-p", "no:cacheprovider", f"{__file__}::{_THIS}"])
        assert child.returncode == 0, child.stdout[-4000:] + child.stderr[-2000:]
        assert " passed" in child.stdout
        return
    first = launch(_sharded_against_reference, launch_seed, nproc=2, backend="gloo", timeout_s=300)
    assert first["replaced"] == "norm=5,mlp=2,attention=2,causal_lm=1"
    assert first["moved"] > 1e-3  # the reference trained: a wrapper that did nothing fails
    assert first["error"] < 1e-5, f"launch seed {launch_seed}"
