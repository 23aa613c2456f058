"""DDP wrappers and ShardedOptimizer on 2 gloo ranks against single-process training (float64).

One launch runs every check (starting ranks costs seconds); each rank returns its numbers and
the test process asserts on them.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lmscope.parallel.ddp import (
    BucketedDDP,
    CoalescedDDP,
    FlatDDP,
    NaiveDDP,
    OverlapDDP,
    TorchDDP,
    data_parallel,
    describe,
)
from lmscope.parallel.launch import RankContext, launch
from lmscope.parallel.sharded_optimizer import ShardedOptimizer
from lmscope.parallel.strategies import parse_strategy

WORLD = 2
PER_RANK = 3
STEPS = 4
WRAPPERS = {
    "naive": NaiveDDP,
    "flat": FlatDDP,
    "overlap": OverlapDDP,
    "bucketed-small": lambda m: BucketedDDP(m, bucket_size_mb=0.0004),  # ~420 B: many buckets
    "bucketed-large": lambda m: BucketedDDP(m, bucket_size_mb=100),
    "coalesced-small": lambda m: CoalescedDDP(m, bucket_size_mb=0.0004),
    "coalesced-large": lambda m: CoalescedDDP(m, bucket_size_mb=100),
    "torch-ddp": lambda m: TorchDDP(m, bucket_cap_mb=0.0004),
}
ZERO_GRAD = {  # zero_grad(set_to_none=...) per step: fresh gradients, gradients kept (bucket views), both
    "none": lambda step: True,
    "zero": lambda step: False,
    "alternate": lambda step: step % 2 == 0,
}


class TiedModel(nn.Module):
    """Embedding and LM head share one weight (communicated once)."""

    def __init__(self, vocab: int = 23, dim: int = 13) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.hidden = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.hidden(self.embed(tokens))))


class FrozenModel(nn.Module):
    """A frozen middle layer, a buffer, and a keyword argument in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(11, 17)
        self.frozen = nn.Linear(17, 17).requires_grad_(False)
        self.last = nn.Linear(17, 5)
        self.register_buffer("shift", torch.randn(17))

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return self.last(torch.relu(self.frozen(torch.tanh(self.first(x)) + self.shift)) * scale)


def _batch(kind: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    rows = WORLD * PER_RANK
    if kind == "tied":
        return (torch.randint(0, 23, (rows, 7), generator=generator),
                torch.randint(0, 23, (rows, 7), generator=generator))
    return torch.randn(rows, 11, generator=generator, dtype=torch.float64), \
        torch.randint(0, 5, (rows,), generator=generator)


def _loss(kind: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if kind == "tied":
        return F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    return F.cross_entropy(model(x, scale=0.7), y)


def _max_diff(first: nn.Module, second: nn.Module) -> float:
    return max((a - b).abs().max().item()
               for a, b in zip(first.parameters(), second.parameters(), strict=True))


def _build(kind: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return (TiedModel() if kind == "tied" else FrozenModel()).double()


def _bucket_views(wrapped: nn.Module) -> float:
    """1.0 when every synced gradient is its bucket slot (the same tensor object), else 0.0."""
    views = [(p, v) for b in wrapped.buckets for p, v in zip(b.params, b.views, strict=True)]
    inside = all(p.grad is v and v.untyped_storage().data_ptr() == b.buffer.untyped_storage().data_ptr()
                 for b in wrapped.buckets for p, v in zip(b.params, b.views, strict=True))
    return float(inside and len(views) == len(wrapped.synced_parameters))


def _train_against_reference(ctx: RankContext, wrapper: str, kind: str, zero_grad: str,
                             seed: int) -> dict[str, float]:
    """Train the wrapped model (each rank its slice) and the reference (the full batch)."""
    model = _build(kind, seed + 1 + ctx.rank)  # ranks differ until the wrapper broadcasts rank 0's
    reference = _build(kind, seed + 1)
    wrapped = WRAPPERS[wrapper](model)
    frozen_before = model.frozen.weight.detach().clone() if kind == "frozen" else None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=0.9)
    generator = torch.Generator().manual_seed(seed + 2)
    rows = slice(ctx.rank * PER_RANK, (ctx.rank + 1) * PER_RANK)
    views = []
    for step in range(STEPS):
        x, y = _batch(kind, generator)
        optimizer.zero_grad(set_to_none=ZERO_GRAD[zero_grad](step))
        _loss(kind, wrapped, x[rows], y[rows]).backward()
        wrapped.finish_gradient_synchronization()
        if isinstance(wrapped, BucketedDDP):
            views.append(_bucket_views(wrapped))
        optimizer.step()
        reference_optimizer.zero_grad()
        _loss(kind, reference, x, y).backward()
        reference_optimizer.step()
    synced = [p for p in model.parameters() if p.requires_grad]
    reference_grads = [r.grad for p, r in zip(model.parameters(), reference.parameters(), strict=True)
                       if p.requires_grad]
    out = {
        "param_diff": _max_diff(model, reference),
        "grad_diff": max((p.grad - r).abs().max().item()
                         for p, r in zip(synced, reference_grads, strict=True)),
        "bucket_views": min(views) if views else 1.0,
        "buffer_diff": max([(a - b).abs().max().item()
                            for a, b in zip(model.buffers(), reference.buffers(), strict=True)] or [0.0]),
        "module_is_model": float(wrapped.module is model),
        "moved": _max_diff(model, _build(kind, seed + 1)),
    }
    if kind == "tied":
        out["synced_count"] = float(len(getattr(wrapped, "synced_parameters", synced)))
    else:
        out["frozen_changed"] = (model.frozen.weight - frozen_before).abs().max().item()
        out["frozen_grad_is_none"] = float(model.frozen.weight.grad is None)
    return out


class Unused(nn.Module):
    """A trainable parameter that never takes part in the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 3)
        self.unused = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def _missing_gradient_errors() -> dict[str, str]:
    messages = {}
    for name in ("naive", "flat", "overlap", "bucketed-small", "coalesced-small"):
        wrapped = WRAPPERS[name](Unused().double())
        wrapped(torch.randn(2, 4, dtype=torch.float64)).sum().backward()
        try:
            wrapped.finish_gradient_synchronization()
            messages[name] = "no error"
        except RuntimeError as error:
            messages[name] = str(error)
    return messages


def _second_backward_errors() -> dict[str, str]:
    """Two backwards before finish_gradient_synchronization: the bucketed wrappers refuse."""
    messages = {}
    for name in ("bucketed-small", "coalesced-large"):
        wrapped = WRAPPERS[name](Mlp().double())
        x = torch.randn(2, 9, dtype=torch.float64)
        wrapped(x).sum().backward()
        try:
            wrapped(x).sum().backward()
            messages[name] = "no error"
        except RuntimeError as error:
            messages[name] = str(error)
    return messages


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(9, 31)
        self.b = nn.Linear(31, 7)
        self.c = nn.Linear(7, 3, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def _groups(model: Mlp) -> list[dict]:
    return [{"params": [model.a.weight], "lr": 0.01, "weight_decay": 0.1},
            {"params": [model.a.bias, model.b.weight], "lr": 0.003}]


ADAMW = dict(lr=0.005, weight_decay=0.01, betas=(0.8, 0.95))


def _sharded_optimizer_checks(ctx: RankContext, seed: int) -> dict[str, object]:
    """ShardedOptimizer(AdamW) vs AdamW over three param groups, then checkpoint round trip."""
    torch.manual_seed(seed)
    model = Mlp().double()
    reference = copy.deepcopy(model)
    sharded = ShardedOptimizer(_groups(model), torch.optim.AdamW, **ADAMW)
    sharded.add_param_group({"params": [model.b.bias, model.c.weight], "lr": 0.02})
    plain = torch.optim.AdamW(_groups(reference), **ADAMW)
    plain.add_param_group({"params": [reference.b.bias, reference.c.weight], "lr": 0.02})
    generator = torch.Generator().manual_seed(seed + 3)

    def step(net: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad()
        F.mse_loss(net(x), y).backward()
        optimizer.step()

    for index in range(3):
        x = torch.randn(8, 9, generator=generator, dtype=torch.float64)
        y = torch.randn(8, 3, generator=generator, dtype=torch.float64)
        if index == 2:  # a scheduler-style change of a hyperparameter
            sharded.param_groups[1]["lr"] = plain.param_groups[1]["lr"] = 0.05
        step(model, sharded, x, y)
        step(reference, plain, x, y)
    out: dict[str, object] = {
        "param_diff": _max_diff(model, reference),
        "owned_numel": sum(p.numel() for p, rank in sharded.owner.items() if rank == ctx.rank),
        "local_states": len(sharded.local.state),
    }
    sharded.zero_grad()
    out["grads_cleared"] = all(p.grad is None for p in model.parameters())
    sharded.consolidate_state_dict(to=0)
    state = None
    if ctx.rank == 0:
        state = sharded.state_dict()
        expected = plain.state_dict()
        out["state_keys_match"] = sorted(state["state"]) == sorted(expected["state"])
        out["state_diff"] = max(
            (state["state"][k][name].double() - expected["state"][k][name].double()).abs().max().item()
            for k in expected["state"] for name in ("exp_avg", "exp_avg_sq", "step")
        )
        out["groups_match"] = state["param_groups"] == expected["param_groups"]
    else:
        try:
            sharded.state_dict()
            out["state_dict_refused"] = False
        except RuntimeError:
            out["state_dict_refused"] = True
    shared = [state]
    dist.broadcast_object_list(shared, src=0)
    restored_model = copy.deepcopy(model)
    restored = ShardedOptimizer(_groups(restored_model), torch.optim.AdamW, **ADAMW)
    restored.add_param_group({"params": [restored_model.b.bias, restored_model.c.weight]})
    restored.load_state_dict(shared[0])
    x = torch.randn(8, 9, generator=generator, dtype=torch.float64)
    y = torch.randn(8, 3, generator=generator, dtype=torch.float64)
    step(restored_model, restored, x, y)
    step(reference, plain, x, y)
    out["restored_diff"] = _max_diff(restored_model, reference)
    return out


def _all_checks(ctx: RankContext, seed: int) -> list[dict[str, object]]:
    results: dict[str, object] = {}
    for wrapper in WRAPPERS:
        for kind in ("tied", "frozen"):
            for zero_grad in ZERO_GRAD:
                results[f"{wrapper}/{kind}/{zero_grad}"] = _train_against_reference(
                    ctx, wrapper, kind, zero_grad, seed)
        results[f"{wrapper}/settings"] = describe(WRAPPERS[wrapper](Mlp().double()))
    results["missing"] = _missing_gradient_errors()
    results["twice"] = _second_backward_errors()
    results["sharded"] = _sharded_optimizer_checks(ctx, seed)
    gathered: list[dict[str, object]] = [{} for _ in range(ctx.world_size)]
    dist.all_gather_object(gathered, results)
    return gathered


@pytest.fixture(scope="module")
def ranks(launch_seed: int) -> list[dict[str, object]]:
    return launch(_all_checks, launch_seed, nproc=WORLD, backend="gloo", timeout_s=240,
                  preload=["torch._dynamo"])


@pytest.mark.parametrize("wrapper", list(WRAPPERS))
@pytest.mark.parametrize("kind", ["tied", "frozen"])
@pytest.mark.parametrize("zero_grad", list(ZERO_GRAD))
def test_wrapper_matches_single_process_training(ranks, wrapper, kind, zero_grad):
    for rank in ranks:
        got = rank[f"{wrapper}/{kind}/{zero_grad}"]
        assert got["param_diff"] < 1e-12, got
        assert got["grad_diff"] < 1e-12, got  # the last step's gradients are the full batch's
        assert got["bucket_views"] == 1.0  # BucketedDDP: every .grad is its slot after each step
        assert got["buffer_diff"] == 0.0
        assert got["module_is_model"] == 1.0
        assert got["moved"] > 1e-3  # training did change the parameters
        if kind == "tied":
            assert got["synced_count"] == 3  # embed (= head), hidden weight and bias
        else:
            assert got["frozen_changed"] == 0.0
            assert got["frozen_grad_is_none"] == 1.0


def test_missing_gradient_names_the_parameter(ranks):
    for rank in ranks:
        for name, message in rank["missing"].items():
            assert "unused.weight" in message and "unused.bias" in message, (name, message)


def test_second_backward_before_finish_is_refused(ranks):
    for rank in ranks:
        for name, message in rank["twice"].items():
            assert "arrived twice" in message and "c.weight" in message, (name, message)


def test_settings_say_how_gradients_are_averaged(ranks):
    settings = ranks[0]
    assert settings["naive/settings"] == "average=divide, all-reduce sum"  # gloo has no AVG
    assert settings["bucketed-large/settings"] == ("average=divide, all-reduce sum, bucket_cap_mb=100, "
                                                   "buckets=1")
    # Mlp, reverse order, 419 B cap: [c.weight 168 B + b.bias 56 B], b.weight, a.bias, a.weight
    assert settings["coalesced-small/settings"].endswith("bucket_cap_mb=0.0004, buckets=4")
    torch_ddp = settings["torch-ddp/settings"]
    buffers = "forward_sync_buffers" if "forward_sync_buffers" in torch_ddp else "broadcast_buffers"
    assert torch_ddp == (f"bucket_cap_mb=0.0004, first_bucket_mb=0.0004, gradient_as_bucket_view=True, "
                         f"{buffers}=False, static_graph=False, find_unused_parameters=False")


def test_sharded_optimizer_matches_adamw(ranks):
    owned = [rank["sharded"]["owned_numel"] for rank in ranks]
    largest = 31 * 9
    assert sum(owned) == sum(p.numel() for p in Mlp().parameters())
    assert max(owned) - min(owned) <= largest
    for rank in ranks:
        got = rank["sharded"]
        assert got["param_diff"] < 1e-12
        assert got["restored_diff"] < 1e-12
        assert 0 < got["local_states"] < 6  # this rank's shard only
        assert got["grads_cleared"]
    first = ranks[0]["sharded"]
    assert first["state_keys_match"] and first["groups_match"]
    assert first["state_diff"] < 1e-12
    assert ranks[1]["sharded"]["state_dict_refused"]


def test_parse_strategy():
    assert parse_strategy("bucketed:25") == ("bucketed", 25.0)
    assert parse_strategy("bucketed:250") == ("bucketed", 250.0)
    assert parse_strategy("bucketed:0.5") == ("bucketed", 0.5)
    assert parse_strategy("coalesced:500") == ("coalesced", 500.0)
    assert parse_strategy("torch-ddp") == ("torch-ddp", None)  # PyTorch's default caps
    assert parse_strategy("torch-ddp:500") == ("torch-ddp", 500.0)
    assert parse_strategy("overlap") == ("overlap", None)
    assert parse_strategy("fsdp:separate-reduce") == ("fsdp", None)
    for bad in ("bucketed", "bucketed:0", "bucketed:x", "bucketed:inf", "bucketed:nan", "coalesced",
                "torch-ddp:", "torch-ddp:-5", "fast", "naive:3", "fsdp:separate",
                "torch-fsdp2:separate-reduce"):
        with pytest.raises(ValueError):
            parse_strategy(bad)
    with pytest.raises(RuntimeError, match="process group"):
        data_parallel("naive", nn.Linear(2, 2))
