"""FastTransformerLM against the eager TransformerLM with the same weights: loss, logits, gradients.

Without CUDA the Triton kernels run in Triton's interpreter, which must be switched on before
Triton decorates them: `test_fast_model_in_interpreter` reruns this file in a child pytest with
TRITON_INTERPRET=1, and the kernel-using tests skip in the parent.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from triton_child import module_under_test, rerun_in_interpreter

from lmscope.config import preset
from lmscope.model.transformer import TransformerLM
from lmscope.workloads.step import Spec

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIG = preset("tiny", vocab_size=97, d_model=24, d_ff=40, num_heads=3, num_layers=2, context_length=16)


def test_fast_model_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(scope="module")
def fast_cls():
    module = module_under_test("lmscope.model.fast_transformer", "test_fast_model_in_interpreter")
    return module.FastTransformerLM


def _pair(fast_cls, attention: str, seed: int):
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        eager = TransformerLM(CONFIG)
        fast = fast_cls(CONFIG, attention=attention)
    fast.load_state_dict(eager.state_dict())
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 6), generator=gen).to(DEVICE)
    targets = torch.randint(0, CONFIG.vocab_size, (2, 6), generator=gen).to(DEVICE)
    return eager, fast, tokens, targets


def _eager_loss(model, tokens, targets):
    return F.cross_entropy(model(tokens).float().flatten(0, 1), targets.flatten())


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.double() for name, p in model.named_parameters()}


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a - ref).norm() / ref.norm()).item()


def test_fp32_loss_and_every_gradient_match_eager(fast_cls) -> None:
    eager, fast, tokens, targets = _pair(fast_cls, "flash", seed=1)
    ours = fast(tokens, targets)
    ours.backward()
    ref = _eager_loss(eager, tokens, targets)
    ref.backward()
    assert abs(ours.item() - ref.item()) < 1e-5 * abs(ref.item())
    theirs, mine = _grads(eager), _grads(fast)
    assert list(mine) == list(theirs)
    for name in theirs:
        assert _rel(mine[name], theirs[name]) < 1e-5, name


def test_fp32_logits_match_eager(fast_cls) -> None:
    eager, fast, tokens, _ = _pair(fast_cls, "flash", seed=2)
    with torch.no_grad():
        ours, ref = fast(tokens), eager(tokens)
    assert ours.shape == ref.shape == (2, 6, CONFIG.vocab_size)
    assert torch.allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_bf16_within_twice_the_eager_bf16_error(fast_cls) -> None:
    """Under bf16 autocast both models are compared with the eager model in fp32."""
    eager, fast, tokens, targets = _pair(fast_cls, "flash", seed=3)
    exact = _eager_loss(eager, tokens, targets)
    exact.backward()
    exact_grads = _grads(eager)
    eager.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        eager_bf16 = _eager_loss(eager, tokens, targets)
        fast_bf16 = fast(tokens, targets)
    eager_bf16.backward()
    fast_bf16.backward()
    assert fast_bf16.dtype == torch.float32
    # the interpreter truncates fp32 -> bf16 where the GPU rounds (see tests/kernels/test_rmsnorm.py)
    factor = 3.0 if DEVICE == "cpu" else 2.0
    loss_tol = factor * abs(eager_bf16.item() - exact.item()) + 2e-3
    assert abs(fast_bf16.item() - exact.item()) <= loss_tol
    theirs, mine = _grads(eager), _grads(fast)
    total_ours = sum(_rel(mine[n], exact_grads[n]) for n in exact_grads)
    total_eager = sum(_rel(theirs[n], exact_grads[n]) for n in exact_grads)
    assert total_ours <= factor * total_eager


def test_state_dicts_load_both_ways(fast_cls) -> None:
    eager, fast, _, _ = _pair(fast_cls, "flash", seed=4)
    assert {k: v.shape for k, v in fast.state_dict().items()} == {
        k: v.shape for k, v in eager.state_dict().items()}
    with torch.device(DEVICE):
        other = TransformerLM(CONFIG)
    other.load_state_dict(fast.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.parameters(), eager.parameters(), strict=True))


def test_too_long_sequence_is_a_value_error(fast_cls) -> None:
    with torch.device(DEVICE):
        fast = fast_cls(CONFIG)
    with pytest.raises(ValueError, match="context_length"):
        fast(torch.zeros(1, CONFIG.context_length + 1, dtype=torch.long, device=DEVICE))


def test_train_step_fast_matches_eager_loss_and_gradients(fast_cls) -> None:
    from lmscope.workloads.train_step import TrainStep

    common = dict(vocab_size=97, d_model=24, d_ff=40, num_heads=3, num_layers=2, context_length=6,
                  batch_size=2, mode="forward-backward", device=DEVICE)
    fast = TrainStep(Spec(fast=True, attention="flash", **common))
    eager = TrainStep(Spec(attention="naive", **common))
    assert isinstance(fast.model, fast_cls)
    loss = fast.loss().item()
    assert abs(loss - eager.loss().item()) < 1e-5 * loss
    fast()
    eager()
    for name, ref in _grads(eager.model).items():
        assert _rel(_grads(fast.model)[name], ref) < 1e-5, name


@pytest.mark.parametrize("torch_fused", [False, True])
def test_bf16_train_steps_keep_the_shadow_weights_current(fast_cls, torch_fused: bool) -> None:
    """FusedAdamW writes the bf16 copies; any other optimizer's step makes them re-copied.

    torch's fused AdamW does not bump version counters: the copies must be fresh anyway.
    """
    from lmscope.kernels.adamw import FusedAdamW
    from lmscope.workloads.train_step import TrainStep

    common = dict(vocab_size=97, d_model=24, d_ff=40, num_heads=3, num_layers=2, context_length=6,
                  batch_size=2, mode="train-step", precision="bf16", device=DEVICE)
    ours, theirs = (TrainStep(Spec(fast=True, attention="flash", **common)) for _ in range(2))
    assert isinstance(ours.optimizer, FusedAdamW)
    lr, steps, atol = 1e-2, 3, 3e-3  # AdamW moves a weight ~lr per step: well above atol
    for group in ours.optimizer.param_groups:
        group["lr"] = lr
    theirs.optimizer = torch.optim.AdamW(theirs.model.parameters(), lr=lr, fused=torch_fused)
    before = [p.detach().clone() for p in theirs.model.parameters()]
    for _ in range(steps):
        ours()
        theirs()
    theirs.loss()  # the forward re-copies what torch's AdamW changed
    for step in (ours, theirs):
        shadows = step.model.current_shadows()
        assert shadows is not None and shadows.views
        for index in range(len(shadows.groups)):
            shadows.stack(index)
        for weight, copy in shadows.views.items():
            # the interpreter truncates fp32 -> bf16 stores where the GPU rounds: 1 ulp apart
            torch.testing.assert_close(copy.float(), weight.detach().to(torch.bfloat16).float(),
                                       rtol=2**-7, atol=0)
    for a, b, b0 in zip(ours.model.parameters(), theirs.model.parameters(), before, strict=True):
        # every tensor moved by well over the tolerance, so an optimizer that did nothing fails
        assert (b - b0).abs().max() > 5 * atol
        torch.testing.assert_close(a, b, rtol=0, atol=atol)


def test_optimizer_in_backward_trains_like_the_separate_step(fast_cls, monkeypatch) -> None:
    """The fast step with each weight updated inside the backward ends where the separate one does
    when that one's block weight gradients are rounded to bf16 as the in-backward matmuls hand
    them over (autocast's eager model rounds them the same way): bit for bit."""
    from lmscope.model import fast_transformer
    from lmscope.workloads.train_step import TrainStep

    common = dict(vocab_size=97, d_model=24, d_ff=40, num_heads=3, num_layers=2, context_length=6,
                  batch_size=2, mode="train-step", precision="bf16", device=DEVICE, fast=True,
                  attention="flash")
    separate = TrainStep(Spec(**common))
    inside = TrainStep(Spec(**common, optimizer_in_backward=True))
    with monkeypatch.context() as patch:  # the separate step's weight gradients via bf16
        patch.setattr(fast_transformer, "matmul_into", lambda a, b, dtype: (a @ b).to(dtype))
        for _ in range(3):
            separate()
            inside()
    block_weights = [w for group in inside.model._weight_groups() for w in group]
    assert all(w.grad is None for w in block_weights)  # handed over, never accumulated
    assert inside.model.lm_head.weight.grad is not None  # the others come through .grad
    for (name, a), b in zip(separate.model.named_parameters(), inside.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    stacks = [step.model.current_shadows().stacks for step in (separate, inside)]
    assert all(torch.equal(a, b) for a, b in zip(*stacks, strict=True))  # the bf16 copies too


def test_shadow_copies_are_opt_in_and_survive_edge_cases(fast_cls) -> None:
    """Off unless turned on; refused for tied weights; made under inference_mode, then trained."""
    config = preset("tiny", vocab_size=53, d_model=16, d_ff=24, num_layers=2, num_heads=2, context_length=8)
    tokens = torch.randint(0, 53, (2, 8), device=DEVICE)
    model = fast_cls(config).to(DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        model(tokens, tokens)
    assert model.current_shadows() is None  # never turned on: every forward casts

    with torch.inference_mode(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        assert model.shadow_weights(torch.bfloat16) is not None
        model(tokens, tokens)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        model(tokens, tokens).backward()  # the copies are normal tensors: autograd can save them

    tied = fast_cls(config).to(DEVICE)
    tied.layers[1].ffn.w2.weight = tied.layers[0].ffn.w2.weight
    assert tied.shadow_weights(torch.bfloat16) is None and tied.current_shadows() is None
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        assert torch.isfinite(tied(tokens, tokens))


def test_dropped_shadow_weights_let_the_copies_and_replaced_weights_go(fast_cls) -> None:
    """What ddp's wrap() relies on before FSDP replaces the parameters (the copies held every full
    block weight of the 8B model alive beside its shards)."""
    import gc
    import weakref

    model = fast_cls(CONFIG).to(DEVICE)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 6), device=DEVICE)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        shadows = weakref.ref(model.shadow_weights(torch.bfloat16))
        model(tokens, tokens).backward()
    old = weakref.ref(model.layers[0].ffn.w2.weight)
    model.drop_shadow_weights()
    model.layers[0].ffn.w2.weight = torch.nn.Parameter(model.layers[0].ffn.w2.weight.detach().clone())
    model.zero_grad(set_to_none=True)
    gc.collect()
    assert shadows() is None and old() is None and model.current_shadows() is None
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        model(tokens, tokens).backward()  # casts each weight again, no copies made
    assert model.current_shadows() is None


def test_spec_rejects_fast_with_naive_attention_or_a_peer() -> None:
    with pytest.raises(ValueError, match="--attention flash"):
        Spec(fast=True)
    with pytest.raises(ValueError, match="pick one"):
        Spec(fast=True, attention="sdpa", peer="hf")
    with pytest.raises(ValueError, match="drop --compile on"):
        Spec(fast=True, attention="flash", compile=True)
    for fields in (dict(), dict(fast=True, attention="flash"),
                   dict(fast=True, attention="flash", precision="bf16", mode="forward-backward")):
        with pytest.raises(ValueError, match="needs --fast on --precision bf16 --mode train-step"):
            Spec(optimizer_in_backward=True, **fields)
    assert Spec(fast=True, attention="flash").fast


@pytest.mark.skipif(torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs a CPU-only process without the Triton interpreter")
def test_fast_on_cpu_without_interpreter_says_what_to_do() -> None:
    from lmscope.workloads.train_step import TrainStep

    with pytest.raises(ValueError, match="CUDA GPU"):
        TrainStep(Spec(fast=True, attention="flash", device="cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_small_preset_on_gpu_bf16_matches_eager(fast_cls) -> None:
    config = preset("small", num_layers=4, context_length=512)
    torch.manual_seed(0)
    with torch.device("cuda"):
        eager, fast = TransformerLM(config), fast_cls(config, attention="flash")
    fast.load_state_dict(eager.state_dict())
    tokens = torch.randint(0, config.vocab_size, (4, 512), device="cuda")
    targets = torch.randint(0, config.vocab_size, (4, 512), device="cuda")
    exact = _eager_loss(eager, tokens, targets)
    exact.backward()
    exact_grads = _grads(eager)
    eager.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager_bf16, fast_bf16 = _eager_loss(eager, tokens, targets), fast(tokens, targets)
    eager_bf16.backward()
    fast_bf16.backward()
    assert abs(fast_bf16.item() - exact.item()) <= 2 * abs(eager_bf16.item() - exact.item()) + 1e-3
    theirs, mine = _grads(eager), _grads(fast)
    errors = {n: (_rel(mine[n], g), _rel(theirs[n], g)) for n, g in exact_grads.items()}
    assert sum(ours for ours, _ in errors.values()) <= 2 * sum(eager for _, eager in errors.values())
    for name, (ours, eager) in errors.items():
        assert ours <= 4 * eager + 1e-3, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fast_train_step_never_synchronizes_the_host(fast_cls) -> None:
    from lmscope.workloads.train_step import TrainStep

    step = TrainStep(Spec(size="small", num_layers=2, context_length=512, precision="bf16", fast=True,
                          attention="flash", device="cuda"))
    for _ in range(2):  # the first calls compile and autotune the kernels
        step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    assert isinstance(step.model, fast_cls)


def test_weight_hand_over_wiring_is_checked_and_stays_out_of_copies(fast_cls) -> None:
    import copy

    from lmscope.kernels.adamw import FusedAdamW

    model = fast_cls(CONFIG).to(DEVICE)
    with pytest.raises(ValueError, match="FusedAdamW\\(step_in_backward=True\\)"):
        model.update_weights_in_backward(FusedAdamW(model.parameters()))  # steps separately
    with pytest.raises(ValueError, match="holding every trainable block weight"):
        model.update_weights_in_backward(FusedAdamW([model.lm_head.weight], step_in_backward=True))
    optimizer = FusedAdamW(model.parameters(), step_in_backward=True)
    model.update_weights_in_backward(optimizer)
    twin = copy.deepcopy(model)  # the wiring is not module state
    assert twin.layers[0].ffn.w2.weight is not model.layers[0].ffn.w2.weight
    tied = fast_cls(CONFIG).to(DEVICE)
    tied.layers[1].ffn.w2.weight = tied.layers[0].ffn.w2.weight
    with pytest.raises(ValueError, match="tied weights"):
        tied.update_weights_in_backward(FusedAdamW(tied.parameters(), step_in_backward=True))


def test_weight_hand_over_leaves_a_frozen_weight_alone(fast_cls) -> None:
    torch.manual_seed(5)
    model = fast_cls(CONFIG).to(DEVICE)
    frozen = model.layers[0].attn.k_proj.weight
    frozen.requires_grad_(False)
    before = frozen.detach().clone()
    from lmscope.kernels.adamw import FusedAdamW

    optimizer = FusedAdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2,
                           step_in_backward=True)
    model.update_weights_in_backward(optimizer)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 6), device=DEVICE)
    trained = model.layers[0].attn.q_proj.weight.detach().clone()
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        model(tokens, tokens).backward()
    optimizer.step()
    assert torch.equal(frozen.detach(), before)
    assert not torch.equal(model.layers[0].attn.q_proj.weight.detach(), trained)
    model.update_weights_in_backward(None)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        model(tokens, tokens).backward()
    assert model.layers[1].ffn.w2.weight.grad is not None  # unwired: through .grad again
