"""Which blocks to checkpoint, recompute selectively or offload under a memory budget: candidate
plans, their peak, and what they cost in time.

A plan is a checkpoint policy of `lmscope.accounting.treatments`: per block full checkpointing,
selective recompute, offload to host memory, or nothing. The candidates:

* full checkpointing alone (as before): none; every K-th block (one K per number of blocks it
  checkpoints; K = ceil(sqrt(L)) is the classic sqrt(L) schedule); the first N blocks for every
  N (the finest dial: one more block at a time, recomputed late in the backward when little else
  is alive); all blocks;
* with selective recompute: the first n blocks full, the next m selective, the rest as they are,
  for every n and m;
* with offload: each of those that does not fit, with its first k blocks offloaded, k the fewest
  that fit (the earliest blocks' activations are needed last, so their copies have the most time).

A candidate's peak comes from the memory model of the step that runs: the eager model's replay
(`predict_memory`; with `world_size` > 1 its FSDP peak, `predict_fsdp`), or the fast model's
(`predict_fast_memory`, which models what the fast block saves: see its docstring; under FSDP
AdamW's moments live where `optimizer_state` says), or, with a measured `memory --activations`
row, the measured peak without checkpointing plus the predicted change scaled by the
measured/predicted bytes a block saves. A plan fits when its peak is at most
the budget less a margin (default 5 %, a choice: the memory models leave out cuBLAS workspaces
and the allocator's rounding, and on GPUs they have predicted a little under the measured peaks;
see docs/memory.md). What a plan costs is the time its treatments add
(`lmscope.accounting.treatment_cost`: recompute FLOPs at the device's peak, the rebuilt
elementwise work's traffic at its memory bandwidth, offload's exposed transfers at its host-link
bandwidth), as a share of the ideal step; `recompute_share_pct` is the full recompute's FLOPs
as a share of the step's (the matmul convention: selective's elementwise work adds none). The
chosen plan is the one that adds the least time and fits (ties: the lower peak).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from lmscope.accounting.fast_memory import fast_block_bytes, fast_dims, saved_by_block
from lmscope.accounting.flops import forward_flops_by_component, step_flops
from lmscope.accounting.fsdp import check_optimizer_state
from lmscope.accounting.memory import (
    GIB,
    checkpointed_blocks,
    eager_block_bytes,
    saved_activations_by_group,
)
from lmscope.accounting.step_peak import predicted_step_peak
from lmscope.accounting.treatment_cost import Rates, block_forward_flops, step_time_s, treatment_time_s
from lmscope.accounting.treatments import PLAN_PREFIX, BlockTreatments, parse_treatments
from lmscope.config import ModelConfig

_UNITS = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
MARGIN_PCT = 5.0
"""Default share of the budget a plan leaves free for what the memory model does not hold."""


def parse_bytes(text: str) -> int:
    """'40GiB', '40 GB', '512MiB', '1.5TiB', '4096B' -> bytes (GiB/MiB binary, GB/MB decimal).

    A unit is required: a bare number is refused rather than read as bytes. The number is read
    exactly (no float: '8.2MB' is 8200000 bytes, not one less); a fraction of a byte left by a
    decimal of a large unit is dropped, and a size that comes to less than one byte is refused.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"cannot read the memory size {text!r}: write a number and a unit, "
                         "e.g. 40GiB, 40GB or 512MiB")
    size = math.floor(Fraction(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise ValueError(f"memory size {text!r} must be at least one byte, e.g. 40GiB or 512MiB")
    return size


@dataclass(frozen=True, kw_only=True)
class MeasuredSaved:
    """Measured facts a plan can start from (a `memory --activations` row without checkpointing)."""

    step_peak: int
    """Measured peak bytes of the step without checkpointing."""
    block_saved: int
    """Measured bytes one block saves for backward (median over the blocks)."""


TREATMENTS = ("full", "selective", "offload")
"""What the planner may use; `plan:BUDGET` policies use full checkpointing only."""
DEFAULT_DEVICE = "H100 SXM"


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One plan with its predicted peak and what it costs."""

    policy: str
    schedule: str
    checkpointed: int
    """Fully checkpointed blocks."""
    selective: int = 0
    offloaded: int = 0
    peak: int
    recompute_share_pct: float
    extra_pct: float
    """Time the treatments add, as a percentage of the ideal step."""
    fits: bool

    def as_record(self) -> dict[str, object]:
        return {"policy": self.policy, "schedule": self.schedule, "checkpointed_blocks": self.checkpointed,
                "selective_blocks": self.selective, "offloaded_blocks": self.offloaded,
                "predicted_peak_gib": self.peak / GIB, "recompute_share_pct": self.recompute_share_pct,
                "predicted_extra_pct": self.extra_pct, "fits": self.fits}


@dataclass(frozen=True, kw_only=True)
class CheckpointPlan:
    """The candidates shown (full checkpointing alone, then per number of fully checkpointed
    blocks the fastest mix that fits) and the one chosen."""

    budget: int
    margin_pct: float
    candidates: tuple[Candidate, ...]
    chosen: Candidate
    source: str
    """'model' (a memory model) or 'measured' (a measured peak and block size)."""
    model: str
    """Which memory model: eager, eager-fsdp, fast or fast-fsdp."""
    device: str


def candidate_policies(num_layers: int) -> list[tuple[str, str]]:
    """(policy, schedule) pairs of full checkpointing alone, each distinct set of blocks once."""
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


def _mix(num_layers: int, full: int, selective: int, offload: int) -> str:
    return BlockTreatments(num_layers, tuple(range(full)), tuple(range(full, full + selective)),
                           tuple(range(offload))).policy


def plan_checkpointing(config: ModelConfig, *, batch_size: int, seq_len: int, budget: int,
                       mode: str = "train-step", precision: str = "bf16", attention: str = "sdpa",
                       measured: MeasuredSaved | None = None, margin_pct: float = MARGIN_PCT,
                       treatments: tuple[str, ...] = TREATMENTS, fast: bool = False, world_size: int = 1,
                       device: str = DEFAULT_DEVICE, host_link_gbps: float | None = None,
                       optimizer_state: str = "device") -> CheckpointPlan:
    """Every candidate's peak and cost, and the fastest whose peak fits `budget` bytes less
    `margin_pct` percent of it. `fast`: lmscope's fast model; `world_size` > 1: FSDP over that many
    ranks (memory per rank); `device`: the catalog entry whose rates price the treatments;
    `optimizer_state`: where AdamW's moments live (host: the fast model under FSDP only).

    Raises ValueError naming the smallest predicted peak when no candidate fits.
    """
    if not 0 <= margin_pct < 100:
        raise ValueError(f"margin must be a percentage in [0, 100), got {margin_pct!r}: e.g. --margin 5")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"the FSDP degree must be a whole number of at least 1, got {world_size!r}: "
                         "e.g. --fsdp 2 (1: one device)")
    unknown = sorted(set(treatments) - set(TREATMENTS))
    if unknown:
        raise ValueError(f"unknown treatments {', '.join(unknown)}: choose from {', '.join(TREATMENTS)}")
    if mode == "forward":
        raise ValueError("checkpointing saves memory kept for backward: plan it for "
                         "--mode train-step or forward-backward")
    if fast and mode != "train-step":
        raise ValueError("the fast model's memory model covers train steps: plan it with --mode train-step")
    check_optimizer_state(optimizer_state)
    if optimizer_state == "host" and not (fast and world_size > 1):
        raise ValueError("host optimizer state is modelled for the fast model under FSDP: pass --fast on "
                         "and --fsdp 2 or more, or --optimizer-state device")
    usable = budget * (1 - margin_pct / 100)
    config = config.replace(context_length=max(config.context_length, seq_len))
    model = _StepModel(config, batch_size, seq_len, mode, precision, attention, fast, world_size, measured,
                       optimizer_state)
    rates = Rates.of(device, precision, host_link_gbps)
    causal = attention != "naive"
    block_flops = block_forward_flops(config, batch_size, seq_len, causal)
    ideal = step_time_s(config, batch_size, seq_len, causal, rates)
    layers = config.num_layers
    evaluated: dict[str, Candidate] = {}

    def candidate(policy: str, schedule: str) -> Candidate:
        if policy not in evaluated:
            chosen = parse_treatments(policy, layers)
            peak = model.peak(policy)
            times = treatment_time_s(chosen.per_block(), block_flops=block_flops, costs=model.block_bytes,
                                     rates=rates)
            evaluated[policy] = Candidate(
                policy=policy, schedule=schedule, checkpointed=len(chosen.full),
                selective=len(chosen.selective), offloaded=len(chosen.offload), peak=peak,
                recompute_share_pct=recompute_share_pct(config, batch_size, seq_len, mode, len(chosen.full)),
                extra_pct=100 * times["extra"] / ideal, fits=peak <= usable)
        return evaluated[policy]

    full_only = [candidate(policy, schedule) for policy, schedule in candidate_policies(layers)
                 if "full" in treatments or policy == "none"]
    fulls = range(layers + 1) if "full" in treatments else range(1)
    mixes = [(n, m) for n in fulls for m in range(layers - n + 1)
             if m == 0 or "selective" in treatments]
    frontier: dict[int, Candidate] = {}
    for n, m in mixes:
        base = candidate(_mix(layers, n, m, 0), _schedule(n, m, 0))
        if not base.fits and "offload" in treatments:
            base = _fewest_offloaded(lambda k, n=n, m=m: candidate(_mix(layers, n, m, k), _schedule(n, m, k)),
                                     layers) or base
        if n not in frontier or _better(base, frontier[n]):
            frontier[n] = base
    fitting = [c for c in evaluated.values() if c.fits]
    if not fitting:
        least = min(evaluated.values(), key=lambda c: c.peak)
        need = least.peak / (1 - margin_pct / 100)
        raise ValueError(f"no checkpointing plan fits {budget / GIB:.2f} GiB with a {margin_pct:g} % margin: "
                         f"the smallest predicted peak is {least.peak / GIB:.2f} GiB ({least.policy}); "
                         f"raise --budget to at least {need / GIB:.2f} GiB, or lower the batch size or "
                         "context length")
    chosen = min(fitting, key=_rank)
    shown = list(dict.fromkeys([*full_only, *(frontier[n] for n in sorted(frontier))]))
    if chosen not in shown:
        shown.append(chosen)
    return CheckpointPlan(budget=budget, margin_pct=margin_pct, candidates=tuple(shown), chosen=chosen,
                          source="measured" if measured else "model", model=model.name, device=rates.device)


def _rank(candidate: Candidate) -> tuple[float, int]:
    return candidate.extra_pct, candidate.peak


def _better(one: Candidate, other: Candidate) -> bool:
    """Fits where the other does not, or is faster among fitting, or is smaller among not fitting."""
    if one.fits != other.fits:
        return one.fits
    return _rank(one) < _rank(other) if one.fits else one.peak < other.peak


def _schedule(full: int, selective: int, offload: int) -> str:
    parts = [f"first {full} full"] if full else []
    if selective:
        parts.append(f"next {selective} selective")
    if offload:
        parts.append(f"first {offload} offloaded")
    return ", ".join(parts) or "none"


def _fewest_offloaded(candidate: Callable[[int], Candidate], layers: int) -> Candidate | None:
    """The candidate with the fewest offloaded first blocks that fits (peaks fall as k grows)."""
    low, high = 1, layers
    if not candidate(high).fits:
        return None
    while low < high:
        middle = (low + high) // 2
        if candidate(middle).fits:
            high = middle
        else:
            low = middle + 1
    return candidate(low)


class _StepModel:
    """The memory model a plan's peaks come from, and what a block saves and moves."""

    def __init__(self, config: ModelConfig, batch_size: int, seq_len: int, mode: str, precision: str,
                 attention: str, fast: bool, world_size: int, measured: MeasuredSaved | None,
                 optimizer_state: str) -> None:
        self.config, self.batch_size, self.seq_len, self.mode = config, batch_size, seq_len, mode
        self.precision, self.attention, self.fast, self.world_size = precision, attention, fast, world_size
        self.optimizer_state = optimizer_state
        self.name = ("fast" if fast else "eager") + ("-fsdp" if world_size > 1 else "")
        point = dict(batch_size=batch_size, seq_len=seq_len, precision=precision, attention=attention)
        if fast:
            dims = fast_dims(config, world_size=world_size, **point)
            self.block_bytes = fast_block_bytes(dims)
            predicted_block = sum(saved_by_block(dims, "none").values())
        else:
            self.block_bytes = eager_block_bytes(config, **point)
            predicted_block = saved_activations_by_group(config, **point)["block"]
        self.measured = measured
        self.scale = measured.block_saved / predicted_block if measured is not None else 1.0
        self.without = self._predicted("none")

    def _predicted(self, policy: str) -> int:
        return predicted_step_peak(self.config, batch_size=self.batch_size, seq_len=self.seq_len,
                                   mode=self.mode, precision=self.precision, attention=self.attention,
                                   checkpoint=policy, fast=self.fast, world_size=self.world_size,
                                   optimizer_state=self.optimizer_state)

    def peak(self, policy: str) -> int:
        if self.measured is None:
            return self._predicted(policy)
        return round(self.measured.step_peak + self.scale * (self._predicted(policy) - self.without))


def recompute_share_pct(config: ModelConfig, batch_size: int, seq_len: int, mode: str, blocks: int) -> float:
    """The forward FLOPs of `blocks` recomputed blocks as a percentage of the step's FLOPs."""
    components = forward_flops_by_component(config, batch_size, seq_len)
    block = (sum(components.values()) - components["lm_head"]) / config.num_layers
    return 100.0 * blocks * block / step_flops(config, batch_size, seq_len, mode)


def resolve_checkpoint(policy: str, config: ModelConfig, *, batch_size: int, seq_len: int, mode: str,
                       precision: str, attention: str) -> str:
    """A concrete policy: `plan:BUDGET` becomes the planner's choice among full checkpointing plans
    (as it always has), anything else is checked as is."""
    if policy.startswith(PLAN_PREFIX):
        budget = parse_bytes(policy.removeprefix(PLAN_PREFIX))
        return plan_checkpointing(config, batch_size=batch_size, seq_len=seq_len, budget=budget,
                                  mode=mode, precision=precision, attention=attention,
                                  treatments=("full",)).chosen.policy
    checkpointed_blocks(policy, config.num_layers)
    return policy
