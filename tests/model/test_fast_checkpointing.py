"""Block treatments on lmscope's fast model: the same loss and gradients under every policy (bit for
bit in the interpreter), and what each block keeps on the device as
`lmscope.accounting.fast_memory` predicts it.

Without CUDA the Triton kernels run in Triton's interpreter: `test_fast_treatments_in_interpreter`
reruns this file in a child pytest with TRITON_INTERPRET=1 and the kernel tests skip in the parent.
With CUDA the offloaded tensors really go to pinned host memory and back on a side stream.
"""

from __future__ import annotations

import contextlib
import gc
import sys

import pytest
import torch
from host_copies import alive, record_host_copies, without_cyclic_gc
from torch.multiprocessing.reductions import StorageWeakRef
from triton_child import module_under_test, rerun_in_interpreter

from lmscope.accounting.fast_memory import fast_dims, saved_by_block, stays_on_device
from lmscope.accounting.treatments import parse_treatments
from lmscope.config import preset
from lmscope.measure.saved_activations import SavedActivations
from lmscope.model.checkpointing import apply_checkpointing

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIG = preset("tiny", vocab_size=97, d_model=24, d_ff=40, num_heads=3, num_layers=3, context_length=16)
BATCH, SEQ = 2, 7
POLICIES = ("selective", "offload", "block+offload", "blocks:0+selective:1-2+offload:0-1")


def test_fast_treatments_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(scope="module")
def fast_cls():
    module = module_under_test("lmscope.model.fast_transformer", "test_fast_treatments_in_interpreter")
    return module.FastTransformerLM


def _run(fast_cls, policy: str, attention: str, bf16: bool, seed: int):
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = fast_cls(CONFIG, attention=attention)
    apply_checkpointing(model, policy)
    gen = torch.Generator().manual_seed(seed)
    tokens, targets = (torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ), generator=gen).to(DEVICE)
                       for _ in range(2))
    saved = SavedActivations(model)
    context = torch.autocast(DEVICE, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with saved.recording(), context:
        loss = model(tokens, targets)
    loss.backward()
    by_block = saved.by("block")
    kept = [by_block.get(f"layers.{i}", 0) for i in range(CONFIG.num_layers)]
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}, kept


def _predicted(policy: str, attention: str, bf16: bool) -> list[int]:
    """Bytes each block keeps on the device (weight copies: the model casts its fp32 weights per
    forward under autocast, as no persistent copies are turned on here; fp32 stacks them)."""
    s = fast_dims(CONFIG, batch_size=BATCH, seq_len=SEQ, precision="bf16" if bf16 else "fp32",
                  attention=attention, weight_copies="casts" if bf16 else "stacks")
    out = []
    for index, (kind, offloaded) in enumerate(parse_treatments(policy, CONFIG.num_layers).per_block()):
        saved = saved_by_block(s, kind)
        if kind == "full" and index == 0:
            saved = {"checkpoint_inputs": 4 * BATCH * SEQ * CONFIG.d_model}  # no pending FFN output yet
        if offloaded:
            saved = {k: v for k, v in saved.items() if k in stays_on_device(s)}
        out.append(sum(saved.values()))
    return out


@pytest.mark.parametrize(("attention", "bf16", "policies"), [
    ("flash", False, POLICIES),
    ("flash", True, ("selective+offload", "block+offload")),
    ("sdpa", False, ("selective+offload", "block")),  # SDPA's output projection copies o: rebuilt
])
def test_every_treatment_keeps_gradients_and_the_predicted_bytes(fast_cls, attention, bf16, policies) -> None:
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    loss, grads, kept = _run(fast_cls, "none", attention, bf16, seed)
    assert kept == _predicted("none", attention, bf16)
    for policy in policies:
        loss_t, grads_t, kept_t = _run(fast_cls, policy, attention, bf16, seed)
        for name, value in {"loss": loss, **grads}.items():
            _same(value, loss_t if name == "loss" else grads_t[name], bf16, (policy, name))
        assert kept_t == _predicted(policy, attention, bf16), policy


def _same(reference: torch.Tensor, value: torch.Tensor, bf16: bool, what: tuple[str, str]) -> None:
    """Bit for bit in the interpreter (recipes rerun the same kernels on the same inputs); on a GPU
    within run-to-run noise, since the flash backward may add dQ atomically."""
    if DEVICE == "cpu":
        assert torch.equal(reference, value), what
    else:
        torch.testing.assert_close(value, reference, rtol=2e-2 if bf16 else 1e-4, atol=1e-3 if bf16 else 1e-5,
                                   msg=str(what))


@pytest.mark.parametrize("policy", ["offload", "selective+offload"])
def test_offloaded_copies_come_back_once_and_are_freed_by_the_backward(fast_cls, monkeypatch, policy) -> None:
    """The block's residual output gets its gradient midway through the block's backward (from
    the second add_rmsnorm), and recipes read offloaded sources: neither brings a copy back twice
    or leaves one on the device; without the cyclic GC the step's copies die with its backward."""
    made = record_host_copies(monkeypatch)
    with torch.device(DEVICE):
        model = fast_cls(CONFIG)
    apply_checkpointing(model, policy)
    tokens = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ), device=DEVICE)
    with without_cyclic_gc():
        loss = model(tokens, tokens)
        copies = alive(made)
        loss.backward()
        assert copies and [c.loads for c in copies] == [1] * len(copies)
        assert [c for c in copies if c.on_device is not None] == []
        del copies
        assert alive(made) == []  # `loss` still holds the graph


def _forward_watching_swiglu(fast_cls, monkeypatch, policy: str):
    """The loss of one forward of the fast model under `policy`, with weak references to the storage
    of every SwiGLU input and output (the storage: a saved handle may hold another tensor of it)."""
    module = sys.modules[fast_cls.__module__]
    inputs: list[StorageWeakRef] = []
    outputs: list[StorageWeakRef] = []
    swiglu = module.swiglu

    def recorded(gate_up: torch.Tensor) -> torch.Tensor:
        out = swiglu(gate_up)
        inputs.append(StorageWeakRef(gate_up.untyped_storage()))
        outputs.append(StorageWeakRef(out.untyped_storage()))
        return out

    monkeypatch.setattr(module, "swiglu", recorded)
    with torch.device(DEVICE):
        model = fast_cls(CONFIG)
    apply_checkpointing(model, policy)
    tokens = torch.randint(0, CONFIG.vocab_size, (BATCH, SEQ), device=DEVICE)
    return model(tokens, tokens), inputs, outputs


@pytest.mark.parametrize("policy", ["selective", "blocks:0+selective:1-2", "none"])
def test_a_forward_whose_backward_never_runs_leaves_nothing_alive(fast_cls, monkeypatch, policy) -> None:
    """An error between a forward and its backward (the paired unwrapped step running out of
    memory, say) drops the graph, and what the blocks saved dies once the cyclic GC has run. A
    saved tensor that held its own node (an output) made a cycle through autograd's C++ graph that
    the collector cannot see: the selective blocks' activations stayed on the device for good."""
    loss, inputs, _ = _forward_watching_swiglu(fast_cls, monkeypatch, policy)
    assert not all(ref.expired() for ref in inputs)  # saved for the backward
    del loss
    gc.collect()
    assert [ref for ref in inputs if not ref.expired()] == []


@pytest.mark.parametrize("policy", ["selective", "blocks:0+selective:1-2", "selective:1"])
def test_selective_blocks_free_swiglus_output_after_the_forward(fast_cls, monkeypatch, policy) -> None:
    """Without outer saved-tensor hooks (a plain step, no SavedActivations) a selective block
    keeps SwiGLU's output as a recipe over gate_up, which the SwiGLU kernel saves as rows (a view
    that dies with its forward): the output is freed after the forward; other blocks keep it."""
    loss, _, outputs = _forward_watching_swiglu(fast_cls, monkeypatch, policy)
    treatments = parse_treatments(policy, CONFIG.num_layers)
    alive_now = [not ref.expired() for ref in outputs]  # fully checkpointed blocks save none either
    expected = [treatments.kind(i) == "none" for i in range(CONFIG.num_layers)]
    assert alive_now == expected, policy
    loss.backward()
