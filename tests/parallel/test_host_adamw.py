"""HostStateAdamW on FullyShardedDP: trains like torch's AdamW over the same shards (2 and 3 gloo
ranks on CPU; one GPU with the moments in pinned host memory), gradients never reach .grad, a
second backward before step() is refused, state dicts round-trip and load torch's AdamW's."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmscope.config import ModelConfig
from lmscope.model.transformer import TransformerLM
from lmscope.parallel.fsdp import FullyShardedDP
from lmscope.parallel.host_adamw import HostStateAdamW
from lmscope.parallel.launch import RankContext, launch

CONFIG = ModelConfig(vocab_size=37, context_length=16, d_model=10, d_ff=23, num_layers=3, num_heads=1)
ADAMW = dict(lr=3e-3, weight_decay=0.01, betas=(0.8, 0.95), eps=1e-4)
"""eps well above fp32 rounding (see test_parallel_fsdp.ADAMW): the two optimizers' rounding
cannot turn into a difference near lr."""
STEPS, PER_RANK, SEQ = 3, 2, 7


class FrozenMiddle(nn.Module):
    """An embedding, a frozen unit, a unit of odd size: frozen shards get no moments."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(29, 11)
        self.frozen = nn.Linear(11, 11).requires_grad_(False)
        self.last = nn.Linear(11, 29)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.last(torch.tanh(self.frozen(self.embed(tokens))))


def _model(kind: str) -> tuple[nn.Module, list[nn.Module] | None, int]:
    if kind == "frozen":
        model = FrozenMiddle()
        return model, [model.embed, model.frozen, model.last], 29
    return TransformerLM(CONFIG), None, CONFIG.vocab_size


def _train(ctx: RankContext, model: nn.Module, units: list[nn.Module] | None, host: bool, batches: list,
           steps: int) -> tuple[FullyShardedDP, torch.optim.Optimizer, dict[str, object]]:
    wrapped = FullyShardedDP(model, units)
    optimizer = (HostStateAdamW(wrapped, **ADAMW) if host
                 else torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], **ADAMW,
                                        foreach=False))
    rows = slice(ctx.rank * PER_RANK, (ctx.rank + 1) * PER_RANK)
    seen: dict[str, object] = {"grads_after_backward": []}
    for tokens, targets in batches[:steps]:
        optimizer.zero_grad(set_to_none=True)
        logits = wrapped(tokens[rows].to(ctx.device))
        F.cross_entropy(logits.float().flatten(0, 1), targets[rows].to(ctx.device).flatten()).backward()
        seen["grads_after_backward"].append(sum(p.grad is not None for p in wrapped.parameters()))
        optimizer.step()
    return wrapped, optimizer, seen


def _relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    ours, theirs = ({n: t[n].cpu().double() for n in b} for t in (a, b))
    return max(((ours[n] - theirs[n]).norm() / theirs[n].norm().clamp_min(1e-30)).item() for n in b)


def _moments(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: state[key].reshape(-1) for key in ("exp_avg", "exp_avg_sq")}


def _case(ctx: RankContext, seed: int, kind: str) -> dict[str, object]:
    torch.manual_seed(seed)
    model, units, vocab = _model(kind)
    model = model.to(ctx.device)
    twin = copy.deepcopy(model)
    named = dict(twin.named_modules())
    twin_units = None if units is None else [named[n] for n in ("embed", "frozen", "last")]
    generator = torch.Generator().manual_seed(seed + 1)
    shape = (ctx.world_size * PER_RANK, SEQ)
    batches = [(torch.randint(0, vocab, shape, generator=generator),
                torch.randint(0, vocab, shape, generator=generator)) for _ in range(STEPS)]
    ours, optimizer, seen = _train(ctx, model, units, True, batches, STEPS)
    theirs, reference, _ = _train(ctx, twin, twin_units, False, batches, STEPS)
    out: dict[str, object] = {"error": _relative(ours.full_state_dict(rank0_only=False),
                                                 theirs.full_state_dict(rank0_only=False)),
                              "grads_after_backward": seen["grads_after_backward"],
                              "host_bytes": optimizer.host_bytes}
    ours_state, theirs_state = optimizer.state_dict()["state"], reference.state_dict()["state"]
    out["moments_error"] = max(_relative(_moments(ours_state[i]), _moments(theirs_state[i]))
                               for i in theirs_state)
    out["steps"] = sorted({float(s["step"]) for s in ours_state.values()})
    out["trainable_shards"] = sum(p.requires_grad for p in ours.parameters())
    out["states"] = len(ours_state)
    return out


def _misuse(ctx: RankContext) -> dict[str, object]:
    """A second forward for a backward before step() is refused before anything changes (the model
    then trains on); clipping and stray .grad are refused; a dropped optimizer hands back to .grad."""
    wrapped = FullyShardedDP(TransformerLM(CONFIG).to(ctx.device))
    optimizer = HostStateAdamW(wrapped)
    tokens = torch.randint(0, CONFIG.vocab_size, (PER_RANK, SEQ), device=ctx.device)
    out: dict[str, object] = {}
    wrapped(tokens).float().sum().backward()
    for name, misuse in (("second_forward", lambda: wrapped(tokens)),
                         ("clip", lambda: wrapped.clip_grad_norm_(1.0))):
        try:
            misuse()
            out[name] = "accepted"
        except RuntimeError as error:
            out[name] = str(error)
    try:
        optimizer.add_param_group({"params": [nn.Parameter(torch.ones(2))]})
        out["add_group"] = "accepted"
    except ValueError as error:
        out["add_group"] = str(error)
    optimizer.step()
    before = wrapped.full_state_dict(rank0_only=False)
    wrapped(tokens).float().sum().backward()  # trains on after the refusal
    optimizer.step()
    out["trains_on"] = _relative(wrapped.full_state_dict(rank0_only=False), before) > 0
    shard = next(iter(wrapped.parameters()))
    shard.grad = torch.zeros_like(shard)
    try:
        optimizer.step()
        out["stray_grad"] = "accepted"
    except RuntimeError as error:
        out["stray_grad"] = str(error)
    shard.grad = None
    del optimizer
    wrapped(tokens).float().sum().backward()
    out["grads_after_drop"] = sum(p.grad is not None for p in wrapped.parameters())
    try:
        HostStateAdamW(FullyShardedDP(TransformerLM(CONFIG).to(ctx.device), param_dtype=torch.float16))
        out["fp16"] = "accepted"
    except ValueError as error:
        out["fp16"] = str(error)
    return out


def _round_trip(ctx: RankContext, seed: int) -> dict[str, float]:
    """torch AdamW's state dict loaded into HostStateAdamW, then one more step each: the same model."""
    torch.manual_seed(seed)
    model = TransformerLM(CONFIG).to(ctx.device)
    twin = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed + 2)
    shape = (ctx.world_size * PER_RANK, SEQ)
    batches = [(torch.randint(0, CONFIG.vocab_size, shape, generator=generator),
                torch.randint(0, CONFIG.vocab_size, shape, generator=generator)) for _ in range(3)]
    theirs, reference, _ = _train(ctx, twin, None, False, batches, 2)
    wrapped = FullyShardedDP(model)
    wrapped.load_full_state_dict(theirs.full_state_dict(rank0_only=False), rank0_only=False)
    ours = HostStateAdamW(wrapped, lr=1.0)  # hyperparameters come from the state dict
    ours.load_state_dict(reference.state_dict())
    saved = copy.deepcopy(ours.state_dict())
    rows = slice(ctx.rank * PER_RANK, (ctx.rank + 1) * PER_RANK)
    tokens, targets = batches[2]
    for net, optimizer in ((wrapped, ours), (theirs, reference)):
        optimizer.zero_grad(set_to_none=True)
        logits = net(tokens[rows].to(ctx.device))
        F.cross_entropy(logits.float().flatten(0, 1), targets[rows].to(ctx.device).flatten()).backward()
        optimizer.step()
    again = HostStateAdamW(FullyShardedDP(TransformerLM(CONFIG).to(ctx.device)), **ADAMW)
    again.load_state_dict(saved)
    reloaded = again.state_dict()["state"]
    full = [net.full_state_dict(rank0_only=False) for net in (wrapped, theirs)]
    return {"error": _relative(*full), "lr": ours.param_groups[0]["lr"],
            "reloaded_error": max(_relative(_moments(reloaded[i]), _moments(saved["state"][i]))
                                  for i in saved["state"])}


def _all(ctx: RankContext, seed: int) -> dict[str, object]:
    return {"transformer": _case(ctx, seed, "transformer"), "frozen": _case(ctx, seed, "frozen"),
            "round_trip": _round_trip(ctx, seed), "misuse": _misuse(ctx)}


@pytest.fixture(scope="module", params=[2, 3])
def ranks(request: pytest.FixtureRequest, launch_seed: int) -> dict[str, object]:
    return launch(_all, launch_seed, nproc=request.param, backend="gloo", timeout_s=300,
                  preload=["torch._dynamo"])


@pytest.mark.parametrize("kind", ["transformer", "frozen"])
def test_trains_like_torch_adamw_over_the_same_shards(ranks, kind):
    result = ranks[kind]
    assert result["error"] < 1e-6, result
    assert result["moments_error"] < 1e-6, result
    assert result["steps"] == [float(STEPS)]
    assert result["states"] == result["trainable_shards"]  # frozen shards get no moments


@pytest.mark.parametrize("kind", ["transformer", "frozen"])
def test_gradients_never_reach_grad(ranks, kind):
    result = ranks[kind]
    assert result["grads_after_backward"] == [0] * STEPS
    assert result["host_bytes"] == 0  # on the CPU the moments stay where they are


def test_misuse_is_refused_in_one_line_and_the_model_trains_on(ranks):
    misuse = ranks["misuse"]
    assert "call step() after each backward" in misuse["second_forward"]
    assert "there is nothing to clip" in misuse["clip"]
    assert "all given at construction" in misuse["add_group"]
    assert misuse["trains_on"]
    assert "hold a .grad" in misuse["stray_grad"]
    assert misuse["grads_after_drop"] == 6  # the optimizer is held weakly: .grad again
    assert "run bf16 or fp32" in misuse["fp16"]


def test_torch_adamw_state_loads_and_round_trips(ranks):
    result = ranks["round_trip"]
    assert result["error"] < 1e-6 and result["reloaded_error"] == 0.0
    assert result["lr"] == ADAMW["lr"]


def _refusals(ctx: RankContext) -> list[str]:
    messages = []
    for build in (lambda: HostStateAdamW(TransformerLM(CONFIG)),
                  lambda: HostStateAdamW(FullyShardedDP(TransformerLM(CONFIG)), lr=-1.0),
                  lambda: HostStateAdamW(FullyShardedDP(TransformerLM(CONFIG)), betas=(0.9, 1.0))):
        try:
            build()
            messages.append("accepted")
        except (TypeError, ValueError) as error:
            messages.append(str(error))
    return messages


def test_bad_arguments_are_refused_with_what_to_do(launch_seed):
    wrap, lr, betas = launch(_refusals, nproc=1, backend="gloo", timeout_s=120)
    assert "wrap the model first" in wrap
    assert "lr, eps and weight_decay must be >= 0" in lr
    assert "betas must be in [0, 1)" in betas


def _on_gpu(ctx: RankContext, seed: int) -> dict[str, object]:
    result = _case(ctx, seed, "transformer")
    result["round_trip"] = _round_trip(ctx, seed)
    torch.manual_seed(seed)
    wrapped = FullyShardedDP(TransformerLM(CONFIG).to(ctx.device))
    optimizer = HostStateAdamW(wrapped, **ADAMW)
    resident = set(wrapped.shards_reduced_last())
    result["states_before_a_step"] = sorted(p in resident for p in optimizer.state)  # the device's: lazy
    tokens = torch.randint(0, CONFIG.vocab_size, (PER_RANK, SEQ), device=ctx.device)
    wrapped(tokens).float().sum().backward()
    optimizer.step()
    result["placement"] = sorted({(p in resident, optimizer.state[p]["exp_avg"].device.type,
                                   optimizer.state[p]["exp_avg"].is_pinned()) for p in optimizer.state})
    result["expected_host_bytes"] = sum(8 * p.numel() for p in optimizer.state if p not in resident)
    result["host_bytes_of_new"] = optimizer.host_bytes
    return result


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_moments_live_pinned_on_the_host_and_train_alike(launch_seed):
    result = launch(_on_gpu, launch_seed, nproc=1, backend="nccl", timeout_s=300)
    # the fused kernel and torch's AdamW round the moments' updates in another order (m + (1-b1)(g-m)
    # against lerp): a few ulp of fp32 apart, where the parameters agree to 1e-6
    assert result["error"] < 1e-6 and result["moments_error"] < 1e-5, result
    assert result["grads_after_backward"] == [0] * STEPS
    assert result["round_trip"]["error"] < 1e-6 and result["round_trip"]["reloaded_error"] == 0.0
    assert result["states_before_a_step"] == [False] * len(result["states_before_a_step"])
    assert result["placement"] == [(False, "cpu", True), (True, "cuda", False)]
    assert result["host_bytes_of_new"] == result["expected_host_bytes"] > 0
