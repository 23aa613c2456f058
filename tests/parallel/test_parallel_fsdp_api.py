"""FullyShardedDP as a user's training loop meets it (a CS336 handout-style model, transformers'
GPT-2): original names and per-name gradients, full state dicts on every rank, class and
transformers policies training like one process, reading a freed weight, summon_full_params, the
sharded grad scaler, clipping; on 2 gloo ranks in one launch, and on 4 ranks in two groups of 2.

Each rank returns its numbers and the test process asserts on them. A crash in a rank (the freed
weight used to segfault) fails the launch, and so these tests, without taking pytest down.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from handout_model import Embedding, HandoutLM, Linear, RMSNorm
from torch import nn

from lmscope.parallel.fsdp import FullyShardedDP
from lmscope.parallel.launch import RankContext, launch
from lmscope.parallel.sharded_grad_scaler import ShardedGradScaler

WORLD = 2
PER_RANK = 2
SEQ = 6
STEPS = 2
VOCAB = 31
ADAMW = dict(lr=3e-3, weight_decay=0.01, betas=(0.8, 0.95), eps=1e-4)
"""eps above fp32 rounding of the gradients (see test_parallel_fsdp.ADAMW)."""
FP32_TOLERANCE = 1e-6
POLICY = (Linear, Embedding)
"""The handout's layer classes as FullyShardedDP's unit policy (the norms join the root)."""

DtypeOf = Callable[[str], torch.dtype | None]


def _batches(seed: int, world: int, steps: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per step, every rank's (tokens, targets) stacked along the batch."""
    generator = torch.Generator().manual_seed(seed)
    shape = (world * PER_RANK, SEQ)
    return [(torch.randint(0, VOCAB, shape, generator=generator),
             torch.randint(0, VOCAB, shape, generator=generator)) for _ in range(steps)]


def _rows(rank: int) -> slice:
    return slice(rank * PER_RANK, (rank + 1) * PER_RANK)


def _loss(out: object, targets: torch.Tensor) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out
    assert isinstance(logits, torch.Tensor)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def _reference_grads(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, world: int,
                     dtype_of: DtypeOf) -> dict[str, torch.Tensor]:
    """Mean over ranks of each rank's gradient, over parameters cast by `dtype_of(name)` (None: as
    they are) and summed over ranks in that dtype: the casts and the reduction FSDP makes."""
    named = dict(model.named_parameters())
    total: dict[str, torch.Tensor] = {}
    for rank in range(world):
        cast = {n: p.detach().to(dtype_of(n) or p.dtype).requires_grad_() for n, p in named.items()}
        out = torch.func.functional_call(model, cast, (tokens[_rows(rank)],))
        grads = torch.autograd.grad(_loss(out, targets[_rows(rank)]), list(cast.values()))
        for name, grad in zip(cast, grads, strict=True):
            total[name] = grad if name not in total else total[name] + grad
    return {n: (g / world).to(named[n].dtype) for n, g in total.items()}


def _train_reference(model: nn.Module, batches: list, world: int,
                     dtype_of: DtypeOf = lambda n: None) -> nn.Module:
    optimizer = torch.optim.AdamW(model.parameters(), **ADAMW)
    for tokens, targets in batches:
        for name, grad in _reference_grads(model, tokens, targets, world, dtype_of).items():
            model.get_parameter(name).grad = grad
        optimizer.step()
    return model


def _train(wrapped: FullyShardedDP, batches: list, rank: int) -> torch.optim.Optimizer:
    optimizer = torch.optim.AdamW(wrapped.parameters(), **ADAMW)
    for tokens, targets in batches:
        optimizer.zero_grad(set_to_none=True)
        _loss(wrapped(tokens[_rows(rank)]), targets[_rows(rank)]).backward()
        optimizer.step()
    return optimizer


def _relative(state: dict[str, torch.Tensor], reference: nn.Module) -> float:
    """Largest over parameters of ||a - b|| / ||b||."""
    return max(((state[n].double() - p.detach().double()).norm() / p.detach().double().norm()).item()
               for n, p in reference.named_parameters())


def _max_abs(tensor: torch.Tensor) -> float:
    return tensor.abs().max().item() if tensor.numel() else 0.0


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


# ---- checks (each runs on every rank and returns this rank's numbers) --------------------------

def _names_and_gradients(ctx: RankContext, seed: int) -> dict[str, object]:
    """One step of the handout model under a class policy; every name's pieces against one process."""
    torch.manual_seed(seed)
    model = HandoutLM()
    start = copy.deepcopy(model)
    wrapped = FullyShardedDP(model, units=POLICY)
    tokens, targets = _batches(seed + 1, ctx.world_size, steps=1)[0]
    optimizer = _train(wrapped, [(tokens, targets)], ctx.rank)  # leaves the gradients in place
    wrapped.finish_gradient_synchronization()
    reference = _reference_grads(start, tokens, targets, ctx.world_size, lambda n: None)
    state = wrapped.full_state_dict(rank0_only=False)
    grad_error, value_error, ranges = 0.0, 0.0, {}
    for name, param in wrapped.named_parameters():
        begin, end = param.local_range
        expected = reference[name].flatten()[begin:end]
        scale = reference[name].abs().max().item()
        grad_error = max(grad_error, _max_abs(param.grad.to_local() - expected) / scale)
        value_error = max(value_error, _max_abs(param.to_local() - state[name].flatten()[begin:end]))
        ranges[name] = (begin, end)
    norm = math.sqrt(sum(g.double().pow(2).sum().item() for g in reference.values()))
    q_grad = dict(wrapped.named_parameters())["layers.1.attn.q_proj.weight"].grad
    q_grad_numel = q_grad.to_local().numel() if q_grad is not None else None
    total = wrapped.clip_grad_norm_(0.5 * norm).item()
    clip_error = max(_max_abs(p.grad.to_local() - 0.5 * reference[n].flatten()[slice(*p.local_range)])
                     / _max_abs(reference[n]) for n, p in wrapped.named_parameters())
    wrapped.module.zero_grad()
    shards = list(wrapped.parameters())
    return {
        "names": [n for n, _ in wrapped.named_parameters()],
        "module_names": [n for n, _ in model.named_parameters()],
        "reference_names": [n for n, _ in start.named_parameters()],
        "shapes_match": all(p.shape == start.get_parameter(n).shape for n, p in wrapped.named_parameters()),
        "numel_match": (sum(p.numel() for p in model.parameters())
                        == sum(p.numel() for p in start.parameters())),
        "grad_error": grad_error,
        "value_error": value_error,
        "ranges": ranges,
        "numels": {n: p.numel() for n, p in start.named_parameters()},
        "q_grad_numel": q_grad_numel,
        "norm": (total, norm),
        "clip_error": clip_error,
        "zeroed": (all(p.grad is None for _, p in wrapped.named_parameters())
                   and all(p.grad is None for p in shards)),
        "shards_once": len({id(p) for p in shards}) == len(shards) == len(list(wrapped._groups()))
                       == len(optimizer.param_groups[0]["params"]),
        "shards_flat": all(p.dim() == 1 for p in shards),
    }


class _Twice(nn.Module):
    """Calls one unit twice."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(5, 5)
        self.outer = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.inner(self.inner(x)))


class _Swap(nn.Module):
    """Runs its two layers in either order."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.b = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor, swap: bool = False) -> torch.Tensor:
        return self.a(self.b(x)) if swap else self.b(self.a(x))


def _message(run: Callable[[], object]) -> str | None:
    """The RuntimeError `run` raises (None if it raises none)."""
    try:
        run()
    except RuntimeError as error:
        return str(error)
    return None


def _unit_order(ctx: RankContext, seed: int) -> dict[str, object]:
    """A class policy takes the order of the first forward; a list out of order, or a unit run
    twice, is refused at the first forward with what to do."""
    torch.manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (PER_RANK, SEQ))
    learned = FullyShardedDP(HandoutLM(), units=POLICY)
    before = [u.name for u in learned.units]
    with torch.no_grad():
        learned(tokens)
    model = HandoutLM()
    listed = FullyShardedDP(model, units=[m for m in model.modules() if isinstance(m, POLICY)])
    twice_model = _Twice()
    twice = FullyShardedDP(twice_model, units=[twice_model.inner, twice_model.outer])
    swap = FullyShardedDP(_Swap(), units=(nn.Linear,))
    x = torch.randn(2, 5)
    with torch.no_grad():
        return {"before": before, "after": [u.name for u in learned.units],
                "listed": _message(lambda: listed(tokens)),
                "twice": _message(lambda: twice(x)),
                "swapped": [_message(lambda: swap(x)), _message(lambda: swap(x, swap=True))]}


def _kept_module(ctx: RankContext, seed: int) -> dict[str, object]:
    """keep_fp32 with a module (one whole block) rather than a class; one naming nothing."""
    torch.manual_seed(seed)
    model = HandoutLM()
    wrapped = FullyShardedDP(model, units=POLICY, param_dtype=torch.bfloat16, keep_fp32=(model.layers[1],))
    seen: dict[str, str] = {}
    for index in (0, 1):
        model.layers[index].attn.q_proj.register_forward_pre_hook(
            lambda m, a, i=index: seen.update({f"block {i} weight": str(m.weight.dtype)}))
        model.layers[index].register_forward_hook(
            lambda m, a, o, i=index: seen.update({f"block {i} input": str(a[0].dtype),
                                                  f"block {i} output": str(o.dtype)}))
    with torch.no_grad():
        wrapped(torch.randint(0, VOCAB, (PER_RANK, SEQ)))
    try:
        FullyShardedDP(HandoutLM(), units=POLICY, param_dtype=torch.bfloat16, keep_fp32=(nn.LayerNorm,))
        refused = None
    except ValueError as error:
        refused = str(error)
    return {"seen": seen, "kept": wrapped.settings["kept_fp32"], "refused": refused}


def _state_dicts(ctx: RankContext, seed: int) -> dict[str, object]:
    """full_state_dict on rank 0 and on every rank (and on another device); both loads."""
    torch.manual_seed(seed)
    wrapped = FullyShardedDP(HandoutLM(), units=POLICY)
    _train(wrapped, _batches(seed + 2, ctx.world_size, steps=1), ctx.rank)
    rank0 = wrapped.full_state_dict()
    every = wrapped.full_state_dict(rank0_only=False)
    meta = wrapped.full_state_dict(rank0_only=False, device="meta")
    torch.manual_seed(seed + 3)
    from_every = FullyShardedDP(HandoutLM(), units=POLICY)
    from_every.load_full_state_dict(every, rank0_only=False)
    from_rank0 = FullyShardedDP(HandoutLM(), units=POLICY)
    from_rank0.load_full_state_dict(rank0 if ctx.rank == 0 else None)
    return {
        "rank0_keys": list(rank0),
        "every": every,
        "rank0_is_every": ctx.rank != 0 or _same(rank0, every),
        "keys": list(HandoutLM().state_dict()),
        "meta": {k: (v.device.type, tuple(v.shape)) for k, v in meta.items()},
        "shapes": {k: tuple(v.shape) for k, v in every.items()},
        "loaded_every": _same(from_every.full_state_dict(rank0_only=False), every),
        "loaded_rank0": _same(from_rank0.full_state_dict(rank0_only=False), every),
    }


def _freed_weights(ctx: RankContext, seed: int) -> dict[str, object]:
    """Reading a sharded weight raises (after a step, between forward and backward, a gradient, a
    pickle); summon_full_params gives the full values, writes back when asked, and leaves the
    wrapper training as before."""
    torch.manual_seed(seed)
    model = HandoutLM()
    wrapped = FullyShardedDP(model, units=POLICY)
    batches = _batches(seed + 4, ctx.world_size, steps=2)
    _train(wrapped, batches[:1], ctx.rank)
    w1 = model.layers[0].ffn.w1
    messages = {
        "after a step": _message(lambda: w1.weight.sum()),
        "root": _message(lambda: model.ln_final.weight.sum()),
        "gradient": _message(lambda: w1.weight.grad.sum()),
        "pickle": _message(lambda: pickle.dumps(model.state_dict())),
        "module call": _message(lambda: model(batches[0][0])),
    }
    tokens, targets = batches[1]
    loss = _loss(wrapped(tokens[_rows(ctx.rank)]), targets[_rows(ctx.rank)])
    messages["before the backward"] = _message(lambda: model.layers[0].attn.q_proj.weight.sum())
    loss.backward()
    state = wrapped.full_state_dict(rank0_only=False)
    with torch.no_grad():
        losses = [_loss(wrapped(tokens), targets).item()]
    with wrapped.summon_full_params():
        summoned = {n: p.detach().clone() for n, p in wrapped.named_parameters()}
        direct = w1.weight.sum().item()
    with wrapped.summon_full_params(writeback=True):
        w1.weight.mul_(2)
    with wrapped.summon_full_params():
        model.ln_final.weight.add_(1)  # not written back
    after = wrapped.full_state_dict(rank0_only=False)
    with wrapped.summon_full_params(writeback=True):
        w1.weight.div_(2)
    with torch.no_grad():
        losses.append(_loss(wrapped(tokens), targets).item())
    messages["after summon"] = _message(lambda: w1.weight.sum())
    doubled = {k: 2 * v if k == "layers.0.ffn.w1.weight" else v for k, v in state.items()}
    return {
        "messages": messages,
        "summoned": _same(summoned, {k: v for k, v in state.items() if k in summoned}),
        "direct": (direct, state["layers.0.ffn.w1.weight"].sum().item()),
        "written_back": _same(after, doubled),
        "losses": losses,
    }


def _policy_training(ctx: RankContext, seed: int, kind: str) -> dict[str, object]:
    """Train a policy-built FSDP and one process on the same global batches; compare the states."""
    torch.manual_seed(seed)
    options: dict[str, object] = {}
    dtype_of: DtypeOf = lambda n: None  # noqa: E731
    seen: dict[str, torch.dtype] = {}
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=16,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        model: nn.Module = GPT2LMHeadModel(config)
    else:
        model = HandoutLM()
        options["units"] = POLICY
    if kind == "handout/bf16-keep":
        options.update(param_dtype=torch.bfloat16, keep_fp32=(RMSNorm,))
        dtype_of = lambda n: None if "ln" in n else torch.bfloat16  # noqa: E731
    start = copy.deepcopy(model)
    batches = _batches(seed + 5, ctx.world_size)
    wrapped = FullyShardedDP(model, **options)  # type: ignore[arg-type]
    if kind == "handout/bf16-keep":
        for label, module in (("norm", model.layers[0].ln1), ("linear", model.layers[0].attn.q_proj)):
            # after FullyShardedDP's hooks: the weight it gathered, the input and output it cast
            module.register_forward_pre_hook(
                lambda m, a, k=label: seen.update({f"{k} weight": m.weight.dtype}))
            module.register_forward_hook(
                lambda m, a, o, k=label: seen.update({f"{k} input": a[0].dtype, f"{k} output": o.dtype}))
    _train(wrapped, batches, ctx.rank)
    state = wrapped.full_state_dict()
    out: dict[str, object] = {"units": len(wrapped.units), "settings": wrapped.settings,
                              "seen": {k: str(v) for k, v in seen.items()},
                              "names": [n for n, _ in wrapped.named_parameters()],
                              "reference_names": [n for n, _ in start.named_parameters()]}
    if ctx.rank == 0:
        reference = _train_reference(copy.deepcopy(start), batches, ctx.world_size, dtype_of)
        out["error"] = _relative(state, reference)
        out["keys_match"] = list(state) == list(reference.state_dict())
        if kind == "handout/bf16-keep":
            fp32 = _train_reference(copy.deepcopy(start), batches, ctx.world_size)
            out["cast_effect"] = _relative(state, fp32)
    return out


def _grad_scaler(ctx: RankContext, seed: int) -> dict[str, object]:
    """An overflow in one rank's shard makes every rank skip the step and back off the scale."""
    torch.manual_seed(seed)
    wrapped = FullyShardedDP(HandoutLM(), units=POLICY)
    optimizer = torch.optim.AdamW(wrapped.parameters(), **ADAMW)
    scaler = ShardedGradScaler("cpu", init_scale=2.0**10)
    batches = _batches(seed + 6, ctx.world_size)
    changed, scales = [], []
    for step, (tokens, targets) in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(_loss(wrapped(tokens[_rows(ctx.rank)]), targets[_rows(ctx.rank)])).backward()
        if step == 0 and ctx.rank == 1:
            wrapped.shards[0].grad[0] = float("inf")
        before = [p.detach().clone() for p in wrapped.parameters()]
        scaler.step(optimizer)
        scaler.update()
        changed.append(any(not torch.equal(a, p) for a, p in zip(before, wrapped.parameters(), strict=True)))
        scales.append(scaler.get_scale())
    return {"changed": changed, "scales": scales}


def _all_checks(ctx: RankContext, seed: int) -> list[dict[str, object]]:
    results: dict[str, object] = {
        "names": _names_and_gradients(ctx, seed),
        "order": _unit_order(ctx, seed),
        "kept": _kept_module(ctx, seed),
        "state": _state_dicts(ctx, seed),
        "freed": _freed_weights(ctx, seed),
        "scaler": _grad_scaler(ctx, seed),
    }
    for kind in ("handout/fp32", "gpt2", "handout/bf16-keep"):
        results[kind] = _policy_training(ctx, seed, kind)
    gathered: list[dict[str, object]] = [{} for _ in range(ctx.world_size)]
    dist.all_gather_object(gathered, results)
    return gathered


@pytest.fixture(scope="module")
def ranks(launch_seed: int) -> list[dict]:
    pytest.importorskip("transformers")
    return launch(_all_checks, launch_seed, nproc=WORLD, backend="gloo", timeout_s=300,
                  preload=["torch._dynamo"])


# ---- names and gradients ------------------------------------------------------------------------

def test_named_parameters_give_every_original_name(ranks):
    for rank in ranks:
        result = rank["names"]
        assert result["names"] == result["module_names"] == result["reference_names"]
        assert "layers.1.attn.q_proj.weight" in result["names"]
        assert result["shapes_match"] and result["numel_match"]


def test_each_name_holds_this_ranks_piece_and_its_gradient(ranks):
    for rank in ranks:
        result = rank["names"]
        assert result["grad_error"] < FP32_TOLERANCE, result["grad_error"]
        assert result["value_error"] == 0.0
    for name, numel in ranks[0]["names"]["numels"].items():  # the ranks' pieces tile each parameter once
        pieces = sorted(r["names"]["ranges"][name] for r in ranks)
        covered = [i for begin, end in pieces for i in range(begin, end)]
        assert covered == list(range(numel)), (name, pieces)
    assert sum(r["names"]["q_grad_numel"] for r in ranks) == 12 * 12


def test_parameters_are_the_flat_shards_once(ranks):
    for rank in ranks:
        assert rank["names"]["shards_once"] and rank["names"]["shards_flat"]


def test_clip_grad_norm_uses_the_norm_over_every_rank(ranks):
    for rank in ranks:
        total, expected = rank["names"]["norm"]
        assert total == pytest.approx(expected, rel=1e-6)
        assert rank["names"]["clip_error"] < 1e-5


def test_module_zero_grad_clears_the_sharded_gradients(ranks):
    assert all(rank["names"]["zeroed"] for rank in ranks)


# ---- units by policy, in forward order ----------------------------------------------------------

def test_a_class_policy_takes_the_order_of_the_first_forward(ranks):
    order = ranks[0]["order"]
    layer = ["attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj", "ffn.w1", "ffn.w3", "ffn.w2"]
    expected = ["token_embeddings", *[f"layers.{i}.{n}" for i in range(2) for n in layer], "lm_head"]
    assert order["after"] == expected
    assert order["before"] != expected  # module order registers w2 before w3


def test_units_out_of_forward_order_are_refused_with_the_fix(ranks):
    message = ranks[0]["order"]["listed"]
    assert message is not None and "forward order" in message and "layers.0.ffn.w2" in message
    assert "units=(nn.Linear" in message and "\n" not in message
    twice = ranks[0]["order"]["twice"]
    assert twice is not None and "inner ran twice" in twice
    first, swapped = ranks[0]["order"]["swapped"]
    assert first is None
    assert swapped is not None and "order of the first forward" in swapped


# ---- state dicts --------------------------------------------------------------------------------

def test_full_state_dict_on_every_rank(ranks):
    first = ranks[0]["state"]
    assert list(first["every"]) == first["keys"] == first["rank0_keys"]
    assert ranks[1]["state"]["rank0_keys"] == []
    for rank in ranks:
        assert rank["state"]["rank0_is_every"]
        assert all(torch.equal(rank["state"]["every"][k], v) for k, v in first["every"].items())


def test_full_state_dict_on_a_device(ranks):
    state = ranks[1]["state"]
    assert state["meta"] == {k: ("meta", shape) for k, shape in state["shapes"].items()}


def test_load_full_state_dict_from_rank0_and_from_every_rank(ranks):
    for rank in ranks:
        assert rank["state"]["loaded_every"] and rank["state"]["loaded_rank0"]


# ---- freed weights and summon_full_params -------------------------------------------------------

@pytest.mark.parametrize("where", ["after a step", "root", "gradient", "pickle", "module call",
                                   "before the backward", "after summon"])
def test_reading_a_freed_weight_raises_and_says_how_to_read_it(ranks, where):
    for rank in ranks:
        message = rank["freed"]["messages"][where]
        assert message is not None, where
        assert "full_state_dict" in message and "\n" not in message
        if where != "pickle":
            assert "summon_full_params" in message


def test_summon_full_params_reads_and_writes_back(ranks):
    for rank in ranks:
        freed = rank["freed"]
        assert freed["summoned"]
        assert freed["direct"][0] == pytest.approx(freed["direct"][1], rel=1e-6)
        assert freed["written_back"]
        assert freed["losses"][0] == freed["losses"][1]


# ---- policies train like one process ------------------------------------------------------------

@pytest.mark.parametrize("kind", ["handout/fp32", "gpt2"])
def test_policy_built_fsdp_trains_like_one_process(ranks, kind):
    result = ranks[0][kind]
    assert result["keys_match"]
    assert result["error"] < FP32_TOLERANCE, result


def test_gpt2_units_are_its_decoder_layers(ranks):
    assert ranks[0]["gpt2"]["units"] == 2  # GPT2Block x2; wte and lm_head share one weight: root
    assert ranks[0]["gpt2"]["names"] == ranks[0]["gpt2"]["reference_names"]  # the tied weight once


def test_keep_fp32_norms_under_bf16(ranks):
    result = ranks[0]["handout/bf16-keep"]
    assert result["seen"] == {"norm input": "torch.float32", "norm weight": "torch.float32",
                              "norm output": "torch.bfloat16", "linear input": "torch.bfloat16",
                              "linear weight": "torch.bfloat16", "linear output": "torch.bfloat16"}
    assert result["settings"]["kept_fp32"] == 5
    assert result["error"] < 2**-8, result
    assert result["cast_effect"] > result["error"], result


def test_keep_fp32_a_module(ranks):
    kept = ranks[0]["kept"]
    assert kept["seen"] == {"block 0 weight": "torch.bfloat16", "block 0 input": "torch.bfloat16",
                            "block 0 output": "torch.bfloat16", "block 1 weight": "torch.float32",
                            "block 1 input": "torch.float32", "block 1 output": "torch.bfloat16"}
    assert kept["kept"] == 1
    assert kept["refused"] is not None and "keep_fp32 names nothing" in kept["refused"]


# ---- grad scaler --------------------------------------------------------------------------------

def test_sharded_grad_scaler_skips_on_every_rank_together(ranks):
    for rank in ranks:
        assert rank["scaler"]["changed"] == [False, True]
        assert rank["scaler"]["scales"] == [2.0**9, 2.0**9]


# ---- subgroups ----------------------------------------------------------------------------------

def _subgroups(ctx: RankContext, seed: int) -> list[dict[str, object]]:
    """Ranks {0, 1} and {2, 3} each shard their own model: built from their group's rank 0, trained
    on their own batches, saved and loaded inside the group."""
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    index = ctx.rank // 2
    group = groups[index]
    torch.manual_seed(seed + ctx.rank)  # every rank starts elsewhere: the broadcast must come from its root
    wrapped = FullyShardedDP(HandoutLM(), units=POLICY, process_group=group)
    batches = _batches(seed + 10 + index, 2)
    torch.manual_seed(seed + 2 * index)
    start = HandoutLM()
    _train(wrapped, batches, ctx.rank % 2)
    state = wrapped.full_state_dict(rank0_only=False)
    root_state = wrapped.full_state_dict()
    torch.manual_seed(seed + 99)
    fresh = FullyShardedDP(HandoutLM(), units=POLICY, process_group=group)
    fresh.load_full_state_dict(root_state if ctx.rank % 2 == 0 else None)
    reference = _train_reference(start, batches, 2)
    out = {"error": _relative(state, reference), "group_rank": wrapped.rank,
           "root_has_state": bool(root_state),
           "loaded": _same(fresh.full_state_dict(rank0_only=False), state),
           "digest": sum(v.double().sum().item() for v in state.values())}
    gathered: list[dict[str, object]] = [{} for _ in range(ctx.world_size)]
    dist.all_gather_object(gathered, out)
    return gathered


def test_subgroups_of_two_on_four_ranks(launch_seed):
    ranks = launch(_subgroups, launch_seed, nproc=4, backend="gloo", timeout_s=300, preload=["torch._dynamo"])
    assert [r["group_rank"] for r in ranks] == [0, 1, 0, 1]
    assert [r["root_has_state"] for r in ranks] == [True, False, True, False]
    for rank in ranks:
        assert rank["error"] < FP32_TOLERANCE, ranks
        assert rank["loaded"]
    assert ranks[0]["digest"] == ranks[1]["digest"] != ranks[2]["digest"] == ranks[3]["digest"]
