"""Block treatments (full, selective, offload) on the eager model: same loss and gradients, and the
bytes each block keeps as the memory model predicts them."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from lmscope.accounting.memory import saved_by_treatment
from lmscope.config import ModelConfig
from lmscope.measure.saved_activations import SavedActivations
from lmscope.model import checkpointing
from lmscope.model.checkpointing import apply_checkpointing
from lmscope.model.transformer import TransformerLM

CONFIG = ModelConfig(vocab_size=89, context_length=48, d_model=40, d_ff=72, num_layers=5, num_heads=5)


def _loss_and_grads(policy: str, autocast: bool, seed: int,
                    attention: str = "naive") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    model = TransformerLM(CONFIG, attention=attention)
    apply_checkpointing(model, policy)
    tokens = torch.randint(0, CONFIG.vocab_size, (3, 31))
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with context:
        logits = model(tokens)
    loss = F.cross_entropy(logits.float().flatten(0, 1), tokens.roll(-1, 1).flatten())
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("policy", ["block", "every:2", "selective", "offload", "selective:1-3+offload",
                                    "block+offload", "blocks:0,2+selective:1,3,4+offload:0-2"])
def test_checkpointing_leaves_loss_and_gradients_unchanged(policy, autocast, attention):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    loss, grads = _loss_and_grads("none", autocast, seed, attention)
    loss_ckpt, grads_ckpt = _loss_and_grads(policy, autocast, seed, attention)
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
    with pytest.raises(ValueError, match="both fully checkpointed and selective"):
        apply_checkpointing(TransformerLM(CONFIG), "block+selective:1")


def test_selective_with_offload_needs_sac_to_pass_its_cache_through_hooks(monkeypatch):
    monkeypatch.setattr(checkpointing, "_SAC_TAKES_HOOKS", False)
    with pytest.raises(ValueError, match="selective with offload on these blocks needs"):
        apply_checkpointing(TransformerLM(CONFIG), "selective:0+offload:0")
    apply_checkpointing(TransformerLM(CONFIG), "selective:0+offload:1")  # apart, they work


def test_offload_refuses_cuda_graph_capture(monkeypatch):
    model = TransformerLM(CONFIG)
    apply_checkpointing(model, "offload:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="cannot be captured in a CUDA graph"):
        model(torch.randint(0, CONFIG.vocab_size, (2, 9)))


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("policy", ["none", "block", "selective", "offload", "block+offload",
                                    "selective+offload"])
def test_each_block_keeps_what_the_memory_model_predicts(policy, autocast):
    """SavedActivations sees what each block keeps on the device (offload's and selective's hooks pass
    what stays on to it); the replay's bytes per block under the treatment say the same."""
    if "selective" in policy and not checkpointing._SAC_TAKES_HOOKS:
        pytest.skip("torch's selective checkpointing hides its cache from saved-tensor hooks here")
    torch.manual_seed(0)
    model = TransformerLM(CONFIG, attention="sdpa")
    apply_checkpointing(model, policy)
    tokens = torch.randint(0, CONFIG.vocab_size, (3, 31))
    saved = SavedActivations(model)
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with saved.recording(), context:
        model(tokens)
    kind = {"block": "full", "selective": "selective"}.get(policy.split("+")[0], "none")
    key = kind + ("+offload" if "offload" in policy else "")
    predicted = saved_by_treatment(CONFIG, batch_size=3, seq_len=31, precision="bf16" if autocast else "fp32",
                                   attention="sdpa", kernel="flash")[key]  # CPU SDPA lays out like flash
    by_block = saved.by("block")
    measured = [by_block.get(f"layers.{i}", 0) for i in range(CONFIG.num_layers)]
    assert measured == [predicted] * CONFIG.num_layers
