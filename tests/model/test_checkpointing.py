"""Activation checkpointing of blocks: same loss and gradients, fewer saved tensors."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from lmscope.config import ModelConfig
from lmscope.model.checkpointing import apply_checkpointing
from lmscope.model.transformer import TransformerLM

CONFIG = ModelConfig(vocab_size=89, context_length=48, d_model=40, d_ff=72, num_layers=5, num_heads=5)


def _loss_and_grads(policy: str, autocast: bool, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    model = TransformerLM(CONFIG, attention="naive")
    apply_checkpointing(model, policy)
    tokens = torch.randint(0, CONFIG.vocab_size, (3, 31))
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with context:
        logits = model(tokens)
    loss = F.cross_entropy(logits.float().flatten(0, 1), tokens.roll(-1, 1).flatten())
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("policy", ["block", "every:2"])
def test_checkpointing_leaves_loss_and_gradients_unchanged(policy, autocast):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    loss, grads = _loss_and_grads("none", autocast, seed)
    loss_ckpt, grads_ckpt = _loss_and_grads(policy, autocast, seed)
    assert torch.equal(loss, loss_ckpt)  # the recompute replays the same ops on the same inputs
    assert grads.keys() == grads_ckpt.keys()
    for name, grad in grads.items():
        assert torch.equal(grad, grads_ckpt[name]), name


def _saved_count(policy: str) -> int:
    model = TransformerLM(CONFIG)
    apply_checkpointing(model, policy)
    count = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(torch.randint(0, CONFIG.vocab_size, (2, 9)))
    return count


def test_checkpointed_blocks_save_less():
    none, every2, block = _saved_count("none"), _saved_count("every:2"), _saved_count("block")
    assert block < every2 < none
    per_block = (none - block) // CONFIG.num_layers
    assert none - every2 == 3 * per_block  # blocks 0, 2 and 4 of 5


def test_policy_chooses_blocks_and_keeps_parameter_names():
    model = TransformerLM(CONFIG)
    names = list(model.state_dict())
    assert apply_checkpointing(model, "every:2") == (0, 2, 4)
    assert list(model.state_dict()) == names
    assert apply_checkpointing(TransformerLM(CONFIG), "none") == ()


def test_bad_uses_raise():
    model = TransformerLM(CONFIG)
    apply_checkpointing(model, "block")
    with pytest.raises(ValueError, match="checkpointed already"):
        apply_checkpointing(model, "block")
    with pytest.raises(ValueError, match="checkpoint policy"):
        apply_checkpointing(TransformerLM(CONFIG), "every:0")
    with pytest.raises(ValueError, match="layers"):
        apply_checkpointing(torch.nn.Linear(2, 2), "block")
