"""The checkpointing planner on hand-made cases: budgets that fit without it, only with all, only with
selective recompute or offload, never; eager and fast memory models."""

from __future__ import annotations

import functools
import math

import pytest

from lmscope.accounting.checkpoint_plan import (
    MeasuredSaved,
    candidate_policies,
    parse_bytes,
    plan_checkpointing,
    resolve_checkpoint,
)
from lmscope.accounting.fast_memory import predict_fast_memory
from lmscope.accounting.memory import checkpointed_blocks, predict_memory, saved_activations_by_group
from lmscope.accounting.treatments import parse_treatments
from lmscope.config import ModelConfig

CONFIG = ModelConfig(d_model=48, d_ff=136, num_layers=5, num_heads=4, vocab_size=97, context_length=512)
POINT = dict(batch_size=2, seq_len=300, mode="forward-backward", precision="fp32", attention="sdpa")
EXACT = dict(POINT, margin_pct=0)
FULL_ONLY = dict(treatments=("full",))


def _peak(policy: str) -> int:
    return predict_memory(CONFIG, checkpoint=policy, **POINT).step_peak


@pytest.mark.parametrize(("text", "expected"), [
    ("40GiB", 40 * 2**30), ("40 GB", 40 * 10**9), ("512MiB", 512 * 2**20), ("1.5gib", 3 * 2**29),
    ("2048B", 2048), ("3 kb", 3000), ("8.2MB", 8_200_000), (".5 KiB", 512),
])
def test_budgets_parse_in_binary_and_decimal_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["40 GiBs", "GiB", "-3GiB", "0MiB", "forty", "40", "0.0000001B", "0.5 B"])
def test_bad_budgets_say_how_to_write_one(text):
    with pytest.raises(ValueError, match="memory size"):
        parse_bytes(text)


def test_candidates_are_distinct_sets_from_none_to_all_with_the_sqrt_schedule():
    policies = candidate_policies(9)
    sets = [checkpointed_blocks(p, 9) for p, _ in policies]
    assert len(set(sets)) == len(sets)
    assert policies[0] == ("none", "none") and policies[-1] == ("block", "all")
    assert (f"every:{math.ceil(math.sqrt(9))}", "sqrt(L)") in policies
    assert {len(s) for s in sets} == set(range(10))  # every count of blocks from 0 to 9


def test_a_budget_that_fits_without_checkpointing_chooses_none():
    plan = plan_checkpointing(CONFIG, budget=_peak("none"), **EXACT)
    assert plan.chosen.policy == "none" and plan.chosen.recompute_share_pct == 0
    assert plan.chosen.peak == _peak("none")


def test_a_tight_budget_checkpoints_every_block():
    peaks = {p: _peak(p) for p, _ in candidate_policies(CONFIG.num_layers)}
    assert min(peaks, key=peaks.get) == "block" and sorted(peaks.values())[1] > peaks["block"]
    plan = plan_checkpointing(CONFIG, budget=peaks["block"], **EXACT, **FULL_ONLY)
    assert plan.chosen.policy == "block" and plan.chosen.checkpointed == CONFIG.num_layers
    assert [c.fits for c in plan.candidates].count(True) == 1
    # every block recomputed: one more forward of the blocks, a third of a forward+backward's FLOPs
    assert 25 < plan.chosen.recompute_share_pct < 100 / 3


def test_between_the_two_the_least_recompute_that_fits_wins():
    budget = (_peak("none") + _peak("block")) // 2
    plan = plan_checkpointing(CONFIG, budget=budget, **EXACT, **FULL_ONLY)
    fitting = [c for c in plan.candidates if c.peak <= budget]
    assert plan.chosen.peak <= budget and plan.chosen.fits
    assert plan.chosen.recompute_share_pct == min(c.recompute_share_pct for c in fitting)
    assert 0 < plan.chosen.checkpointed < CONFIG.num_layers


def test_an_impossible_budget_names_the_minimum():
    least = min(_peak(p) for p, _ in candidate_policies(CONFIG.num_layers))
    with pytest.raises(ValueError, match=rf"smallest predicted peak is {least / 2**30:.2f} GiB .*"
                                         rf"at least {least / 2**30:.2f} GiB"):
        plan_checkpointing(CONFIG, budget=least - 1, **EXACT, **FULL_ONLY)


def test_the_margin_keeps_a_share_of_the_budget_free():
    budget = _peak("none")
    assert plan_checkpointing(CONFIG, budget=budget, **POINT).chosen.policy != "none"  # 5 % by default
    plan = plan_checkpointing(CONFIG, budget=math.ceil(budget / 0.9) + 1, margin_pct=10, **POINT)
    assert plan.chosen.policy == "none"
    with pytest.raises(ValueError, match="margin"):
        plan_checkpointing(CONFIG, budget=budget, margin_pct=100, **POINT)


def test_a_forward_only_step_has_nothing_to_checkpoint():
    with pytest.raises(ValueError, match="forward-backward"):
        plan_checkpointing(CONFIG, budget=2**40, **{**POINT, "mode": "forward"})


def test_measured_rows_shift_and_scale_the_predicted_changes():
    block = saved_activations_by_group(CONFIG, batch_size=2, seq_len=300, precision="fp32",
                                       attention="sdpa")["block"]
    measured = MeasuredSaved(step_peak=_peak("none") + 1000, block_saved=2 * block)
    plan = plan_checkpointing(CONFIG, budget=2**40, measured=measured, **POINT)
    assert plan.source == "measured"
    by_policy = {c.policy: c.peak for c in plan.candidates}
    assert by_policy["none"] == _peak("none") + 1000
    assert by_policy["block"] == _peak("none") + 1000 + 2 * (_peak("block") - _peak("none"))


def test_plan_policies_resolve_to_the_chosen_blocks():
    budget = (_peak("none") + _peak("block")) // 2
    chosen = plan_checkpointing(CONFIG, budget=budget, **POINT, **FULL_ONLY).chosen.policy  # default margin
    assert resolve_checkpoint(f"plan:{budget}B", CONFIG, **POINT) == chosen
    assert resolve_checkpoint("every:2", CONFIG, **POINT) == "every:2"
    with pytest.raises(ValueError, match="plan:BUDGET"):
        resolve_checkpoint("sqrt", CONFIG, **POINT)


@pytest.mark.parametrize(("policy", "blocks"), [("blocks:0-2", (0, 1, 2)), ("blocks:4,1", (1, 4)),
                                                ("blocks:0-1,3-4", (0, 1, 3, 4))])
def test_explicit_block_lists(policy, blocks):
    assert checkpointed_blocks(policy, 5) == blocks


@pytest.mark.parametrize("policy", ["blocks:5", "blocks:3-1", "blocks:a", "blocks:"])
def test_bad_block_lists_are_refused(policy):
    with pytest.raises(ValueError, match="blocks"):
        checkpointed_blocks(policy, 5)


WIDE = ModelConfig(d_model=2048, d_ff=5632, num_layers=8, num_heads=16, vocab_size=1000, context_length=8192)
"""Wide enough that a block's matmuls cost far more than its elementwise work."""
WIDE_POINT = dict(batch_size=1, seq_len=8192, precision="bf16", attention="flash")


def _fast_peak(policy: str, config: ModelConfig = WIDE, **point) -> int:
    return predict_fast_memory(config, checkpoint=policy, **(point or WIDE_POINT)).step_peak


@pytest.mark.parametrize("budget_between", [("none", "selective"), ("none", "block")])
def test_selective_recompute_fits_a_budget_for_less_time_than_full_checkpointing(budget_between):
    budget = sum(_fast_peak(p) for p in budget_between) // 2
    point = dict(WIDE_POINT, budget=budget, margin_pct=0, fast=True)
    full_only = plan_checkpointing(WIDE, **point, **FULL_ONLY).chosen
    plan = plan_checkpointing(WIDE, **point, treatments=("full", "selective"))
    chosen = plan.chosen
    assert chosen.selective > 0 and chosen.offloaded == 0
    assert chosen.extra_pct < full_only.extra_pct  # elementwise work instead of whole forwards
    assert chosen.peak == _fast_peak(chosen.policy) <= budget
    assert chosen.recompute_share_pct == pytest.approx(
        full_only.recompute_share_pct * chosen.checkpointed / full_only.checkpointed)
    fitting = [c for c in plan.candidates if c.fits]
    assert chosen.extra_pct == min(c.extra_pct for c in fitting)


def test_eager_selective_candidates_carry_the_replays_peaks():
    plan = plan_checkpointing(CONFIG, budget=(_peak("none") + _peak("block")) // 2, **EXACT)
    mixes = [c for c in plan.candidates if c.selective]
    assert mixes and all(c.peak == _peak(c.policy) for c in plan.candidates)
    assert plan_checkpointing(CONFIG, budget=2**40, **EXACT).chosen.policy == "none"  # nothing to pay for


DEEP = WIDE.replace(num_layers=20)
DEEP_POINT = dict(WIDE_POINT, world_size=8, fast=True, margin_pct=0)
"""20 fully checkpointed blocks' inputs outweigh one block's recompute: the peak is the forward's end."""


@functools.cache
def _least_without_offload() -> int:
    """The smallest peak of DEEP's plans without offload (the first n blocks full, the rest selective)."""
    layers = DEEP.num_layers
    return min(_fast_peak(f"blocks:0-{n - 1}+selective:{n}-{layers - 1}" if n < layers else "block", DEEP,
                          **WIDE_POINT, world_size=8) for n in range(1, layers + 1))


def test_offload_fits_below_the_smallest_checkpointing_peak():
    least = _least_without_offload()
    with pytest.raises(ValueError, match="no checkpointing plan fits"):
        plan_checkpointing(DEEP, budget=least - 1, treatments=("full", "selective"), **DEEP_POINT)
    chosen = plan_checkpointing(DEEP, budget=least - 1, **DEEP_POINT).chosen
    assert chosen.offloaded > 0 and chosen.peak == _fast_peak(chosen.policy, DEEP, **WIDE_POINT, world_size=8)
    assert chosen.peak < least
    assert parse_treatments(chosen.policy, DEEP.num_layers).offload == tuple(range(chosen.offloaded))


def test_offload_needs_a_host_link_bandwidth():
    budget = _least_without_offload() - 1
    with pytest.raises(ValueError, match="host-link bandwidth for B200"):
        plan_checkpointing(DEEP, budget=budget, device="B200", **DEEP_POINT)
    plan = plan_checkpointing(DEEP, budget=budget, device="B200", host_link_gbps=50, **DEEP_POINT)
    assert plan.chosen.offloaded > 0 and plan.device == "B200"
    with pytest.raises(ValueError, match="no catalog entry"):
        plan_checkpointing(CONFIG, budget=2**40, device="TPU v9", **EXACT)
    with pytest.raises(ValueError, match="unknown treatments recompute"):
        plan_checkpointing(CONFIG, budget=2**40, treatments=("recompute",), **EXACT)


FAST_POINT = dict(batch_size=2, seq_len=300, precision="bf16", attention="flash")


def test_the_fast_model_is_planned_with_its_own_memory_model_per_rank():
    fast_none = predict_fast_memory(CONFIG, world_size=2, **FAST_POINT).step_peak
    fast_block = predict_fast_memory(CONFIG, world_size=2, checkpoint="block", **FAST_POINT).step_peak
    budget = (fast_none + fast_block) // 2
    plan = plan_checkpointing(CONFIG, budget=budget, mode="train-step", margin_pct=0, fast=True,
                              world_size=2, **FAST_POINT)
    assert plan.model == "fast-fsdp" and plan.chosen.fits
    assert plan.chosen.peak == predict_fast_memory(CONFIG, world_size=2, checkpoint=plan.chosen.policy,
                                                   **FAST_POINT).step_peak
    assert plan.candidates[0].peak == fast_none != _peak("none")
    with pytest.raises(ValueError, match="train steps"):
        plan_checkpointing(CONFIG, budget=budget, mode="forward-backward", fast=True, **FAST_POINT)


def test_host_optimizer_state_plans_the_fast_model_under_fsdp_with_its_peaks():
    point = dict(mode="train-step", margin_pct=0, fast=True, world_size=2, **FAST_POINT)
    budget = predict_fast_memory(CONFIG, world_size=2, checkpoint="block", **FAST_POINT).step_peak
    device = plan_checkpointing(CONFIG, budget=budget, **point)
    host = plan_checkpointing(CONFIG, budget=budget, optimizer_state="host", **point)
    assert host.chosen.peak == predict_fast_memory(CONFIG, world_size=2, checkpoint=host.chosen.policy,
                                                   optimizer_state="host", **FAST_POINT).step_peak
    assert host.candidates[0].peak < device.candidates[0].peak  # none: the moments left the device
    assert host.chosen.extra_pct <= device.chosen.extra_pct


@pytest.mark.parametrize(("fast", "world_size", "where", "message"), [
    (True, 2, "cloud", "unknown optimizer state 'cloud': choose one of device, host"),
    (True, 1, "host", "pass --fast on and --fsdp 2 or more"),
    (False, 2, "host", "pass --fast on and --fsdp 2 or more"),
])
def test_host_optimizer_state_is_refused_outside_the_fast_model_under_fsdp(fast, world_size, where, message):
    with pytest.raises(ValueError, match=message):
        plan_checkpointing(CONFIG, budget=2**40, mode="train-step", fast=fast, world_size=world_size,
                           optimizer_state=where, **FAST_POINT)
