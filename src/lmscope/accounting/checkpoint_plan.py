"""Which blocks to checkpoint under a memory budget: candidate plans, their peak and recompute cost.

A plan is a checkpoint policy of `lmscope.model.checkpointing` (none, every:K, blocks:0-N, block).
The candidates are: no checkpointing; every K-th block (one K per number of blocks it
checkpoints; K = ceil(sqrt(L)) is the classic sqrt(L) schedule); the first N blocks for every N
(the finest dial: one more block at a time, recomputed late in the backward when little else is
alive); all blocks. For each, the peak
of the step comes from `predict_memory` (the allocator replay), or, with measured saved
activations, from a measured peak without checkpointing plus the predicted change scaled by the
measured/predicted bytes a block saves. A plan fits when its peak is at most the budget less a
margin (default 5 %, a choice: the memory model leaves out cuBLAS workspaces and the allocator's
rounding, and on GPUs it has predicted a little under the measured peaks; see docs/memory.md).
The recompute cost is the forward FLOPs of the checkpointed
blocks as a share of the step's FLOPs (`lmscope.accounting.flops`). The chosen plan is the one with
the least recompute whose peak fits the budget (ties: the lower peak).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from lmscope.accounting.flops import forward_flops_by_component, step_flops
from lmscope.accounting.memory import GIB, checkpointed_blocks, predict_memory, saved_activations_by_group
from lmscope.config import ModelConfig

_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
PLAN_PREFIX = "plan:"
MARGIN_PCT = 5.0
"""Default share of the budget a plan leaves free for what the memory model does not hold."""


def parse_bytes(text: str) -> int:
    """'40GiB', '40 GB', '512MiB', '1.5TiB', '4096B' -> bytes (GiB/MiB binary, GB/MB decimal).

    A unit is required: a bare number is refused rather than read as bytes.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"cannot read the memory size {text!r}: write a number and a unit, "
                         "e.g. 40GiB, 40GB or 512MiB")
    value = float(match.group(1)) * _UNITS[unit]
    if value <= 0:
        raise ValueError(f"memory size {text!r} must be positive")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class MeasuredSaved:
    """Measured facts a plan can start from (a `memory --activations` row without checkpointing)."""

    step_peak: int
    """Measured peak bytes of the step without checkpointing."""
    block_saved: int
    """Measured bytes one block saves for backward (median over the blocks)."""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One checkpointing plan with its predicted peak and recompute cost."""

    policy: str
    schedule: str
    checkpointed: int
    peak: int
    recompute_share_pct: float
    fits: bool

    def as_record(self) -> dict[str, object]:
        return {"policy": self.policy, "schedule": self.schedule, "checkpointed_blocks": self.checkpointed,
                "predicted_peak_gib": self.peak / GIB, "recompute_share_pct": self.recompute_share_pct,
                "fits": self.fits}


@dataclass(frozen=True, kw_only=True)
class CheckpointPlan:
    """The candidates (no checkpointing first, all blocks last) and the one chosen."""

    budget: int
    margin_pct: float
    candidates: tuple[Candidate, ...]
    chosen: Candidate
    source: str
    """'model' (predict_memory) or 'measured' (a measured peak and block size)."""


def candidate_policies(num_layers: int) -> list[tuple[str, str]]:
    """(policy, schedule) pairs, each distinct set of blocks once."""
    sqrt_k = math.ceil(math.sqrt(num_layers))
    out: list[tuple[str, str]] = [("none", "none")]
    seen: set[tuple[int, ...]] = {()}

    def add(policy: str, schedule: str) -> None:
        blocks = checkpointed_blocks(policy, num_layers)
        if blocks not in seen:
            seen.add(blocks)
            out.append((policy, schedule))

    add(f"every:{sqrt_k}", "sqrt(L)")
    for count in range(1, num_layers):  # one every:K per number of blocks it checkpoints
        add(f"every:{math.ceil(num_layers / count)}", "every k-th")
    for n in range(1, num_layers):
        add(f"blocks:0-{n - 1}", "first n")
    add("block", "all")
    return out


def plan_checkpointing(config: ModelConfig, *, batch_size: int, seq_len: int, budget: int,
                       mode: str = "train-step", precision: str = "bf16", attention: str = "sdpa",
                       measured: MeasuredSaved | None = None,
                       margin_pct: float = MARGIN_PCT) -> CheckpointPlan:
    """Every candidate's peak and recompute share, and the cheapest whose peak fits `budget` bytes
    less `margin_pct` percent of it.

    Raises ValueError naming the smallest predicted peak when no candidate fits.
    """
    if not 0 <= margin_pct < 100:
        raise ValueError(f"margin must be a percentage in [0, 100), got {margin_pct!r}: e.g. --margin 5")
    usable = budget * (1 - margin_pct / 100)
    if mode == "forward":
        raise ValueError("checkpointing saves memory kept for backward: plan it for "
                         "--mode train-step or forward-backward")
    config = config.replace(context_length=max(config.context_length, seq_len))

    def predicted(policy: str) -> int:
        return predict_memory(config, batch_size=batch_size, seq_len=seq_len, mode=mode,
                              precision=precision, attention=attention, checkpoint=policy).step_peak

    without = predicted("none")
    scale = 1.0
    if measured is not None:
        block = saved_activations_by_group(config, batch_size=batch_size, seq_len=seq_len,
                                           precision=precision, attention=attention)["block"]
        scale = measured.block_saved / block
    candidates = []
    for policy, schedule in candidate_policies(config.num_layers):
        count = len(checkpointed_blocks(policy, config.num_layers))
        if measured is None:
            peak = predicted(policy)
        else:
            peak = round(measured.step_peak + scale * (predicted(policy) - without))
        candidates.append(Candidate(policy=policy, schedule=schedule, checkpointed=count, peak=peak,
                                    recompute_share_pct=recompute_share_pct(config, batch_size, seq_len,
                                                                            mode, count),
                                    fits=peak <= usable))
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        least = min(candidates, key=lambda c: c.peak)
        need = least.peak / (1 - margin_pct / 100)
        raise ValueError(f"no checkpointing plan fits {budget / GIB:.2f} GiB with a {margin_pct:g} % margin: "
                         f"the smallest predicted peak is {least.peak / GIB:.2f} GiB ({least.policy}); "
                         f"raise --budget to at least {need / GIB:.2f} GiB, or lower the batch size or "
                         "context length")
    chosen = min(fitting, key=lambda c: (c.recompute_share_pct, c.peak))
    return CheckpointPlan(budget=budget, margin_pct=margin_pct, candidates=tuple(candidates), chosen=chosen,
                          source="measured" if measured else "model")


def recompute_share_pct(config: ModelConfig, batch_size: int, seq_len: int, mode: str, blocks: int) -> float:
    """The forward FLOPs of `blocks` recomputed blocks as a percentage of the step's FLOPs."""
    components = forward_flops_by_component(config, batch_size, seq_len)
    block = (sum(components.values()) - components["lm_head"]) / config.num_layers
    return 100.0 * blocks * block / step_flops(config, batch_size, seq_len, mode)


def resolve_checkpoint(policy: str, config: ModelConfig, *, batch_size: int, seq_len: int, mode: str,
                       precision: str, attention: str) -> str:
    """A concrete policy: `plan:BUDGET` becomes the planner's choice, anything else is checked as is."""
    if policy.startswith(PLAN_PREFIX):
        budget = parse_bytes(policy.removeprefix(PLAN_PREFIX))
        return plan_checkpointing(config, batch_size=batch_size, seq_len=seq_len, budget=budget,
                                  mode=mode, precision=precision, attention=attention).chosen.policy
    checkpointed_blocks(policy, config.num_layers)
    return policy
