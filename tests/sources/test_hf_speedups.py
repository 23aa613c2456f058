"""--fast on and --peer liger for hf: sources: what is refused (one line), what the rows say, and
that the fast step computes the eager step's loss and gradients.

The step tests run lmscope's kernels: without CUDA in Triton's interpreter
(`test_hf_speedups_in_interpreter` reruns this file with TRITON_INTERPRET=1), attention flash-torch.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from triton_child import rerun_in_interpreter, skip_in_parent

from lmscope.sources import ModelRequest, hf_speedups, resolve_source
from lmscope.workloads.model_spec import ModelPointSpec
from lmscope.workloads.step import Spec

pytest.importorskip("transformers")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATTENTION = "flash" if DEVICE == "cuda" else "flash-torch"
SMALL = {"d_model": 48, "num_layers": 2, "num_heads": 4, "vocab_size": 101, "d_ff": 40}
MISTRAL = {"model_type": "mistral", "hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 12, "intermediate_size": 40, "num_hidden_layers": 2, "vocab_size": 101,
           "sliding_window": 16}
"""A small Mistral with grouped key/value heads and a sliding window of 16 tokens."""


@pytest.fixture(scope="module")
def mistral(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("mistral") / "config.json"
    path.write_text(json.dumps(MISTRAL))
    return f"hf:{path}"


def test_hf_speedups_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


def test_the_source_says_what_the_fast_path_replaces() -> None:
    source = resolve_source(ModelRequest(name="hf:qwen2", fast=True, attention="flash", **SMALL))
    assert source.row_fields == {"fast_replaced": "norm=5,mlp=2,attention=2,causal_lm=1"}
    assert source.has_optimizer  # FusedAdamW
    assert resolve_source(ModelRequest(name="hf:qwen2", attention="sdpa", **SMALL)).row_fields == {}


@pytest.mark.parametrize(("fields", "message"), [
    ({"size": "hf:llama", "fast": True, "attention": "flash", "optimizer_in_backward": True,
      "precision": "bf16"}, "--optimizer-in-backward on runs with lmscope's presets"),
    ({"size": "hf:gpt2", "peer": "liger"}, "Liger-Kernel's patches for llama, qwen2, mistral, not gpt2"),
    ({"size": "small", "peer": "liger"}, "--peer liger applies Liger-Kernel to a transformers model"),
    ({"size": "hf:llama", "peer": "liger", "fast": True, "attention": "flash"}, "two different setups"),
])
def test_refusals_are_one_line(fields, message) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        Spec(device="cpu", **{**SMALL, **fields})
    assert "\n" not in str(caught.value)


def test_a_sliding_window_shorter_than_the_context_is_refused(mistral) -> None:
    Spec(size=mistral, fast=True, attention="flash", device="cpu", context_length=16)
    with pytest.raises(ValueError, match="its sliding window 16 is shorter than the context 17"):
        Spec(size=mistral, fast=True, attention="flash", device="cpu", context_length=17)


def test_the_fast_path_names_its_attention_backends() -> None:
    with pytest.raises(ValueError, match="runs lmscope's attention backends: pass --attention flash, "
                                         "flash-torch, sdpa, sdpa-cudnn"):
        resolve_source(ModelRequest(name="hf:llama", fast=True, attention="naive", **SMALL))
    cudnn = resolve_source(ModelRequest(name="hf:llama", fast=True, attention="sdpa-cudnn", **SMALL))
    assert cudnn.row_fields["fast_replaced"]


def test_liger_without_liger_kernel_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(hf_speedups.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="--peer liger needs Liger-Kernel: pip install liger-kernel"):
        resolve_source(ModelRequest(name="hf:llama", peer="liger", attention="sdpa", **SMALL))


def _stub_liger(monkeypatch) -> list:
    """A liger_kernel.transformers whose apply_liger_kernel_to_mistral records its model and, as
    Liger's does, makes forward(shift_labels=...) return the loss of the targets as given."""
    calls = []

    def apply(model=None):
        calls.append(model)
        original = model.forward

        def forward(input_ids=None, shift_labels=None, **kwargs):
            out = original(input_ids=input_ids, **kwargs)
            out.loss = F.cross_entropy(out.logits.float().flatten(0, 1), shift_labels.flatten())
            return out

        model.forward = forward

    package = types.ModuleType("liger_kernel")
    package.__spec__ = importlib.machinery.ModuleSpec("liger_kernel", None)
    module = types.ModuleType("liger_kernel.transformers")
    module.apply_liger_kernel_to_mistral = apply
    monkeypatch.setitem(sys.modules, "liger_kernel", package)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", module)
    return calls


def test_liger_is_applied_to_the_built_model_and_takes_the_same_loss(monkeypatch, mistral) -> None:
    calls = _stub_liger(monkeypatch)
    common = dict(device="cpu", mode="forward-backward", context_length=9, batch_size=2, attention="sdpa")
    from lmscope.workloads.train_step import TrainStep

    liger = TrainStep(Spec(size=mistral, peer="liger", **common))
    eager = TrainStep(Spec(size=mistral, **common))
    assert calls == [liger.model]
    assert liger.loss().item() == pytest.approx(eager.loss().item(), rel=1e-6)


def test_the_fast_step_computes_the_eager_step(monkeypatch) -> None:
    """TrainStep of hf:llama --fast on against the eager hf:llama step of the same seed: the loss
    and every gradient (fp32); the row says what was replaced; the optimizer is FusedAdamW."""
    skip_in_parent("test_hf_speedups_in_interpreter")
    from lmscope.kernels.adamw import FusedAdamW
    from lmscope.workloads.train_step import TrainStep

    common = dict(size="hf:llama", device=DEVICE, context_length=9, batch_size=2, **SMALL)
    fast = TrainStep(Spec(fast=True, attention=ATTENTION, mode="forward-backward", **common))
    eager = TrainStep(Spec(attention="sdpa", mode="forward-backward", **common))
    assert fast.source.row_fields["fast_replaced"] == "norm=5,mlp=2,attention=2,causal_lm=1"
    assert abs(fast.loss().item() - eager.loss().item()) < 1e-5 * eager.loss().item()
    fast()
    eager()
    for (name, a), b in zip(eager.model.named_parameters(), fast.model.parameters(), strict=True):
        assert ((b.grad - a.grad).norm() / a.grad.norm()).item() < 1e-5, name
    trained = TrainStep(Spec(fast=True, attention=ATTENTION, mode="train-step", precision="bf16", **common))
    assert isinstance(trained.optimizer, FusedAdamW)
    first = trained.loss().item()
    for _ in range(3):
        trained()
    assert trained.loss().item() < first


def test_the_fast_step_runs_under_fsdp_on_two_gloo_ranks(tmp_path, capsys) -> None:
    """`lmscope ddp --model hf:qwen2 --fast on --strategy fsdp` (docs/own_model.md): lmscope's FSDP
    wraps the patched model's decoder layers on two gloo ranks, and the row says what was replaced."""
    skip_in_parent("test_hf_speedups_in_interpreter")
    from lmscope.cli import main

    out = tmp_path / "ddp.jsonl"
    sizes = [f"--{key.replace('_', '-')}={value}" for key, value in SMALL.items()]
    code = main(["ddp", "--model", "hf:qwen2", *sizes, "--fast", "on", "--attention", ATTENTION,
                 "--strategy", "fsdp", "--nproc", "2", "--device", "cpu", "--precision", "fp32",
                 "--context-length", "8", "--batch-size", "2", "--warmup", "0", "--steps", "1",
                 "--out", str(out)])
    capsys.readouterr()
    assert code in (None, 0)  # a failure exits (SystemExit) with its code
    by_strategy = {row["strategy"]: row for row in map(json.loads, out.read_text().splitlines())}
    fsdp = by_strategy["fsdp"]
    assert fsdp["status"] == "ok", fsdp.get("error")
    assert fsdp["world_size"] == 2 and fsdp["fast_replaced"] == "norm=5,mlp=2,attention=2,causal_lm=1"
    assert fsdp["parameters"] == by_strategy["single"]["parameters"] > 0


def test_checkpointed_fast_layers_give_the_same_gradients() -> None:
    """bench --checkpoint block on the fast step: the decoder layers recompute their fused forwards."""
    skip_in_parent("test_hf_speedups_in_interpreter")
    from lmscope.model.checkpointing import checkpoint_blocks
    from lmscope.workloads.train_step import TrainStep

    common = dict(size="hf:llama", device=DEVICE, context_length=9, batch_size=2, fast=True,
                  attention=ATTENTION, mode="forward-backward", **SMALL)
    plain, checkpointed = TrainStep(Spec(**common)), TrainStep(Spec(**common, checkpoint="block"))
    assert checkpoint_blocks(checkpointed.built.blocks, "block") == (0, 1)
    plain()
    checkpointed()
    for (name, a), b in zip(plain.model.named_parameters(), checkpointed.model.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize(("fields", "message"), [
    ({"size": "small", "fast": True, "attention": "flash"}, "the fast model's forward does not run them"),
    ({"size": "hf:llama", "checkpoint": "every:0"}, "every:K"),
])
def test_bench_checkpoint_refusals(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        Spec(device="cpu", **{"checkpoint": "block", **fields})


def test_fast_forward_mode_returns_logits() -> None:
    skip_in_parent("test_hf_speedups_in_interpreter")
    from lmscope.workloads.train_step import TrainStep

    step = TrainStep(Spec(size="hf:qwen2", fast=True, attention=ATTENTION, mode="forward", device=DEVICE,
                          context_length=5, batch_size=1, **SMALL))
    with torch.no_grad():
        logits = step.built.run_forward(step.model, step.batch)
    assert logits.shape == (1, 5, SMALL["vocab_size"])


def test_model_point_spec_accepts_hf_fast(mistral) -> None:
    spec = ModelPointSpec(size=mistral, fast=True, attention="flash", device="cpu", context_length=16)
    assert spec.source().row_fields["fast_replaced"] == "norm=5,mlp=2,attention=2,causal_lm=1"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_fast_step_replays_from_cuda_graphs_on_gpu() -> None:
    """The whole hf fast train step (forward, backward, FusedAdamW) captured in CUDA graphs: the
    replays train as the eager fast step does, and bench's row says the graphs ran."""
    from dataclasses import asdict

    from lmscope.workloads.cuda_graph_step import GraphedStep
    from lmscope.workloads.step import run_point
    from lmscope.workloads.train_step import TrainStep

    common = dict(size="hf:llama", fast=True, attention="flash", device="cuda", precision="bf16",
                  context_length=256, batch_size=2, d_model=256, num_heads=4, num_layers=2, d_ff=512,
                  vocab_size=1000)
    eager = TrainStep(Spec(**common, cuda_graph="off"), capturable=True)
    captured = TrainStep(Spec(**common, cuda_graph="on"), capturable=True)
    graphed = GraphedStep(captured)  # three eager steps before the capture
    for _ in range(3):
        eager()
    losses: dict[str, list[float]] = {"eager": [], "graphed": []}
    for _ in range(10):
        eager()
        graphed()
        losses["eager"].append(eager.last_loss.item())
        losses["graphed"].append(captured.last_loss.item())
    assert losses["graphed"][-1] < losses["graphed"][0]
    for a, b in zip(losses["eager"], losses["graphed"], strict=True):
        assert abs(a - b) <= 2e-2 * abs(a), losses
    row = run_point(asdict(Spec(**common, warmup=2, steps=3, target_ci=0.0)))
    assert row["cuda_graph_used"] and row["fast_replaced"] == "norm=5,mlp=2,attention=2,causal_lm=1"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_fast_step_never_synchronizes_the_host() -> None:
    """No host synchronization in the hf fast train step (transformers builds no mask for lmscope's
    attention implementation), which is what lets CUDA graphs capture it."""
    from lmscope.workloads.train_step import TrainStep

    config = Path(__file__).resolve().parents[2] / "examples" / "llama-3.2-1b-shape.json"
    step = TrainStep(Spec(size=f"hf:{config}", num_layers=2, context_length=512,
                          batch_size=2, precision="bf16", fast=True, attention="flash", device="cuda"))
    for _ in range(2):  # the first calls compile and autotune the kernels
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
