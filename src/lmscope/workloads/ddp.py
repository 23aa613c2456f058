"""`lmscope ddp`: a data-parallel training step of a model on N ranks, phase by phase.

Each rank builds the model of the point's source (a preset, hf:..., or a user's factory) on its
device (the wrapper broadcasts rank 0's weights), draws its
own batch of `batch_size` sequences (the batch is per rank), wraps the model with a strategy
(`lmscope.parallel.ddp`) and runs AdamW, whole or sharded (`ShardedOptimizer`). A step is
timed like `bench` (synchronize, host clock) with CUDA-event phases: forward, backward,
comm_wait (time inside `finish_gradient_synchronization`: communication that did not overlap;
None for torch-ddp, which waits inside backward, and for `single`) and optimizer. The row's
`ddp_settings` says how the wrapper communicated (averaging, bucket cap, DDP's arguments). Memory per
rank: allocated after init, peak up to the optimizer step and peak through it. Metrics are
means over ranks with their min and max. `single` (nproc 1) is the baseline: the same per-rank
batch on one device, no communication.

Each multi-rank point first times the same step unwrapped on every rank at once (`local_step_ms`:
no wrapper, no communication, torch's AdamW; skipped when the memory model predicts it cannot fit,
`local_step_skipped` says why: `lmscope.workloads.unwrapped_fit`), then wraps the model and times
the data-parallel step: a paired baseline in the same processes, on the same GPUs and host load,
minutes apart at most. The `single` point runs in another process before or after the others; on
hosts where the eager step is bound by the CPU it drifts by more than the few percent a strategy
costs.

Each multi-rank point also times all-reduces of two sizes, fits t = o + S / w and predicts
its exposed communication with the overhead model of `lmscope.accounting.comms`.

The fully sharded strategies (`fsdp`: lmscope's FullyShardedDP; `torch-fsdp2`: PyTorch's
`fully_shard` per block, same mixed-precision policy) shard parameters, gradients and AdamW state
(bf16: parameters gathered and gradients reduced in bf16 over fp32 master shards). They may run
the fast model (`fast`) and checkpointed blocks (`checkpoint`). Their rows add memory per rank
after the step and rank 0's values beside the mean/min/max, the FSDP accounting
(`lmscope.accounting.fsdp`) with error columns, the bytes our all-gathers and reduce-scatters
moved per step, and `exposed_comm_ms`: the step beyond the paired unwrapped step.

With `profile_steps` > 0 every rank then profiles that many more steps
(`lmscope.workloads.ddp_profile`): the row adds `profile_*` metrics (compute, exposed
communication by phase, idle, host time in the wrapper's hooks, the GPU's busy share of the
step), and rank 0's trace path.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from lmscope.accounting.comms import (
    exposed_comm_s,
    fit_latency_bandwidth,
    optimal_bucket_bytes,
    optimal_bucket_count,
    plan_buckets,
)
from lmscope.accounting.fsdp import check_optimizer_state, predict_fsdp
from lmscope.accounting.memory import checkpointed_blocks
from lmscope.inputs.limits import check_steps, check_timeout
from lmscope.measure.device_memory import release_device_memory
from lmscope.measure.memory import MemoryMeter
from lmscope.measure.ranges import phase
from lmscope.measure.timer import PhaseClock, synchronize, time_phased_steps
from lmscope.model.checkpointing import checkpoint_blocks
from lmscope.model.hf_fast import fast_patch_of
from lmscope.parallel.ddp import MIB, TORCH_DDP_BUCKET_MB, TORCH_DDP_FIRST_BUCKET_MB, data_parallel, describe
from lmscope.parallel.fsdp import FullyShardedDP
from lmscope.parallel.host_adamw import HostStateAdamW
from lmscope.parallel.launch import RankContext, across_ranks, check_world, launch, point_id, resolve_backend
from lmscope.parallel.sharded_optimizer import ShardedOptimizer
from lmscope.parallel.strategies import SEPARATE_REDUCE, SHARDED, parse_strategy
from lmscope.parallel.torch_fsdp2 import torch_fully_shard
from lmscope.workloads.collectives import time_calls
from lmscope.workloads.ddp_profile import point_folder, profile_steps
from lmscope.workloads.model_spec import ModelPointSpec
from lmscope.workloads.train_step import autocast_context, device_facts
from lmscope.workloads.unwrapped_fit import why_unwrapped_cannot_fit

GIB = 2**30
CALIBRATION_BYTES = {"cuda": (1e6, 64e6), "cpu": (1e6, 32e6)}
"""All-reduce sizes timed in each multi-rank point to fit the overhead model's o and w."""


@dataclass(frozen=True, kw_only=True)
class Spec(ModelPointSpec):
    """A data-parallel training point: the model point plus strategy, sharding and world size."""

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("timeout_s", "artifacts_dir")
    """Fields that change how the point runs, not what it measures (left out of its identity)."""

    precision: str = "bf16"
    """fp32 | bf16 | fp16 (autocast over fp32 master weights)."""
    strategy: str = "bucketed:25"
    """naive | flat | overlap | bucketed:<MiB> | coalesced:<MiB> | torch-ddp[:<MiB>] | fsdp |
    torch-fsdp2 | single (baseline)."""
    checkpoint: str = "none"
    """Per-block treatment (`lmscope.accounting.treatments`): none | block | every:K | blocks:LIST |
    selective[:LIST] | offload[:LIST], parts joined with +."""
    shard_optimizer: bool = False
    """Shard AdamW's state across ranks (ShardedOptimizer, ZeRO stage 1)."""
    optimizer_state: str = "device"
    """Where AdamW's moments live with fsdp: device | host (pinned host memory, each unit updated in
    the backward: `lmscope.parallel.host_adamw`)."""
    world_size: int = 2
    """Number of ranks (1 for single)."""
    backend: str = "auto"
    """auto (nccl with GPUs, else gloo) | gloo (CPU) | nccl."""
    warmup: int = 5
    """Untimed steps before measuring."""
    steps: int = 10
    """Timed steps."""
    timeout_s: float = 900.0
    """A rank that fails or hangs ends the point within this many seconds."""
    profile_steps: int = 0
    """Steps profiled after the timed ones (0: none): the step's breakdown per rank."""
    artifacts_dir: str = "runs/ddp-profile"
    """Folder of the profiled points' traces (one sub-folder per point)."""

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device {self.device!r}: ranks pick their own GPU, use auto, cuda or cpu")
        super().__post_init__()
        if self.mode != "train-step":
            raise ValueError(f"lmscope ddp times train steps, got mode {self.mode!r}: drop --mode")
        if self.compile:
            raise ValueError("lmscope ddp does not support torch.compile: run it without --compile")
        name = self.strategy.partition(":")[0]
        if self.fast and name not in (*SHARDED, "single"):
            raise ValueError("--fast on runs with the sharded strategies (fsdp, torch-fsdp2) and the "
                             "single baseline only: drop --fast or pass --strategy fsdp,torch-fsdp2")
        if name in SHARDED and self.precision == "fp16":
            raise ValueError("fsdp and torch-fsdp2 run fp32 or bf16 (fp16 needs a sharded grad scaler): "
                             "pass --precision bf16")
        check_optimizer_state(self.optimizer_state)
        if self.optimizer_state == "host" and name != "fsdp":
            raise ValueError("--optimizer-state host runs with lmscope's FSDP only: pass --strategy fsdp "
                             "(or fsdp:separate-reduce), or drop --optimizer-state")
        if name in SHARDED and self.shard_optimizer:
            raise ValueError("fsdp and torch-fsdp2 shard the optimizer state already: "
                             "drop --shard-optimizer on")
        if self.shard_optimizer and self.source().has_optimizer:
            raise ValueError(f"--shard-optimizer on shards lmscope's AdamW, but {self.size} brings its own "
                             "optimizer: use --shard-optimizer off")
        if self.checkpoint != "none":
            if self.source().blocks is None:
                raise ValueError(f"--checkpoint needs blocks to wrap, and {self.size} exposes none: "
                                 "use --checkpoint none (or return blocks from the factory)")
            checkpointed_blocks(self.checkpoint, self.source().blocks)
        if self.strategy == "single":
            if self.world_size != 1 or self.shard_optimizer:
                raise ValueError("strategy single is the 1-GPU baseline: it runs with --nproc 1, unsharded")
        else:
            parse_strategy(self.strategy)
        check_world(self.world_size, self.resolved_backend())
        check_steps("warmup", self.warmup, 0)
        check_steps("steps", self.steps, 1)
        check_steps("profile_steps", self.profile_steps, 0)
        check_timeout(self.timeout_s)

    def resolved_backend(self) -> str:
        """gloo for --device cpu, else the backend (auto: nccl with GPUs)."""
        backend = resolve_backend(self.backend)
        if self.device == "cpu" and backend == "nccl":
            raise ValueError("backend nccl runs on GPUs, not --device cpu: use --backend gloo")
        if self.device == "cuda" and backend == "gloo":
            raise ValueError("lmscope ddp runs gloo on CPU only: use --backend nccl with --device cuda")
        return "gloo" if self.device == "cpu" else backend


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """Start the ranks (in this process for single), train, return metrics aggregated over ranks."""
    spec = Spec(**point)
    return launch(train, asdict(spec), nproc=spec.world_size, backend=spec.resolved_backend(),
                  timeout_s=spec.timeout_s, run_id=point_id("ddp", asdict(spec)), preload=["torch._dynamo"])


class _Setup:
    """Model, optimizer, scaler and this rank's batch; `wrap` adds the strategy's wrapper."""

    def __init__(self, spec: Spec, ctx: RankContext, meter: MemoryMeter) -> None:
        self.spec, self.device, self.meter = spec, ctx.device, meter
        torch.manual_seed(0)  # the same weights on every rank (the wrapper broadcasts rank 0's)
        self.source = spec.source()
        self.built = self.source.build(self.device)
        self.model = self.built.model
        if spec.checkpoint != "none":
            checkpoint_blocks(self.built.blocks, spec.checkpoint)
        self.parameter_count = sum(p.numel() for p in self.model.parameters())
        torch.manual_seed(1000 + ctx.rank)  # each rank its own batch
        self.batch = self.built.make_batch(spec.batch_size, spec.context_length, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=spec.precision == "fp16")
        self.options = {"lr": 1e-4, "fused": self.device.type == "cuda"}
        self.wrapped: torch.nn.Module = self.model
        self.finish = None
        self.optimizer: torch.optim.Optimizer = self._optimizer()
        self.measures_wait = False
        self.settings: str | None = None

    def _optimizer(self) -> torch.optim.Optimizer:
        """The source's optimizer, else AdamW; sharded (ZeRO-1) with --shard-optimizer on."""
        params = self.model.parameters()
        if self.spec.shard_optimizer:
            return ShardedOptimizer(params, torch.optim.AdamW, **self.options)
        if self.built.optimizer is not None:
            return self.built.optimizer(self.model)
        return torch.optim.AdamW(params, **self.options)

    def wrap(self) -> None:
        """Wrap the model with the strategy and build a fresh (maybe sharded) optimizer."""
        spec = self.spec
        del self.optimizer  # the unwrapped steps' AdamW state: freed before the new one exists
        self.model.zero_grad(set_to_none=True)
        # the fast model's bf16 copies hold every full block weight (a transformers model keeps
        # them in its FastPatch)
        drop_shadows = getattr(fast_patch_of(self.model) or self.model, "drop_shadow_weights", None)
        if drop_shadows is not None:
            drop_shadows()
        release_device_memory()
        # fp16: each rank's own batch may have moved its scale; the wrapped ranks must agree
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=spec.precision == "fp16")
        name = parse_strategy(spec.strategy)[0]
        compute = torch.bfloat16 if spec.precision == "bf16" else None
        if name == "fsdp":
            separate = spec.strategy == SEPARATE_REDUCE  # the reduce-scatters on a communicator of their own
            reduce_group = dist.new_group(list(range(dist.get_world_size()))) if separate else None
            self.wrapped = FullyShardedDP(self.model, param_dtype=compute, reduce_group=reduce_group)
            self.settings = describe(self.wrapped)
            if spec.optimizer_state == "host":
                self.optimizer = HostStateAdamW(self.wrapped, lr=self.options["lr"])
            else:
                self.optimizer = torch.optim.AdamW(self.wrapped.parameters(), **self.options)
            return
        if name == "torch-fsdp2":
            applied = torch_fully_shard(self.model, param_dtype=compute)
            self.settings = ", ".join(f"{k}={v}" for k, v in applied.items())
            self.optimizer = torch.optim.AdamW(self.model.parameters(), **self.options)
            return
        self.wrapped = data_parallel(spec.strategy, self.model)
        self.settings = describe(self.wrapped)
        self.finish = getattr(self.wrapped, "finish_gradient_synchronization", None)
        self.optimizer = self._optimizer()
        self.measures_wait = name != "torch-ddp"

    def step(self, clock: PhaseClock) -> float | None:
        """One training step with phases; returns the peak GiB allocated before the optimizer."""
        clock.start()
        self.optimizer.zero_grad(set_to_none=True)
        with phase("forward"), autocast_context(self.spec.precision, self.device):
            loss = self.built.loss(self.wrapped, self.batch)
        clock.mark("forward")
        with phase("backward"):
            self.scaler.scale(loss).backward()
        clock.mark("backward")
        with phase("comm_wait"):
            if self.finish is not None:
                self.finish()
        clock.mark("comm_wait")
        before = _peak_gib(self.meter)
        with phase("optimizer"):
            self.scaler.step(self.optimizer)
            self.scaler.update()
        clock.mark("optimizer")
        return before


def _peak_gib(meter: MemoryMeter) -> float | None:
    """The peak since the last reset, beyond what the rank's process held before the point (CUDA)."""
    return meter.peak() / GIB if meter.cuda else None


def _allocated_gib(meter: MemoryMeter) -> float | None:
    return meter.current() / GIB if meter.cuda else None


def train(ctx: RankContext, point: dict[str, Any]) -> dict[str, Any]:
    """On every rank: set up, calibrate, warm up, time the steps, aggregate over ranks."""
    spec = Spec(**{**point, "backend": ctx.backend})
    meter = MemoryMeter(ctx.device).take_baseline()  # CUDA: what this process held before the point
    run = _Setup(spec, ctx, meter)
    local_times, local_skipped = None, None
    if spec.strategy != "single":
        local_skipped = why_unwrapped_cannot_fit(spec, ctx.device)
        if local_skipped is None:
            local_times = _time_unwrapped(run, spec, ctx)
        run.wrap()
    synchronize(ctx.device)
    init_gib = _allocated_gib(meter)
    sharded = parse_strategy(spec.strategy)[0] in SHARDED if spec.strategy != "single" else False
    calibration = _calibrate(ctx) if ctx.world_size > 1 and not sharded else None
    after: list[float | None] = []
    measured = time_phased_steps(
        run.step, warmup=spec.warmup, steps=spec.steps, device=ctx.device,
        before_each=meter.reset_peak,
        after_each=lambda: after.append(_peak_gib(meter)),
    )
    times, phases, before = measured.times_ms, measured.phases_ms, measured.results
    local = {
        "step_ms": statistics.fmean(times),
        "step_std_ms": statistics.stdev(times) if len(times) > 1 else 0.0,
        "step_median_ms": statistics.median(times),
        "local_step_ms": statistics.fmean(local_times) if local_times else None,
        **{f"{name}_ms": statistics.fmean(ms) for name, ms in phases.items()},
        "init_allocated_gib": init_gib,
        "peak_before_optimizer_gib": max(before) if init_gib is not None else None,
        "peak_after_optimizer_gib": max(after) if init_gib is not None else None,
        "after_step_allocated_gib": _allocated_gib(meter),
        "baseline_allocated_gib": meter.baseline_allocated_gib,
    }
    if not run.measures_wait:
        local["comm_wait_ms"] = None
    if isinstance(run.wrapped, FullyShardedDP):  # every step moves the same bytes
        ran = spec.warmup + spec.steps
        local["allgather_gib"] = run.wrapped.bytes_gathered / ran / GIB
        local["reduce_scatter_gib"] = run.wrapped.bytes_reduced / ran / GIB
    trace_path = None
    if spec.profile_steps:
        profiled, trace_path = profile_steps(
            run.step, steps=spec.profile_steps, device=ctx.device, rank=ctx.rank,
            folder=point_folder(point, spec.artifacts_dir), step_median_ms=local["step_median_ms"])
        local.update(profiled)
    first = [{k: local[k] for k in MEMORY_KEYS}]
    dist.broadcast_object_list(first, src=0)
    metrics = across_ranks(local)
    metrics["local_step_skipped"] = local_skipped
    if isinstance(run.optimizer, HostStateAdamW):
        metrics["optimizer_host_gib"] = run.optimizer.host_bytes / GIB  # rank 0's
    if trace_path is not None:
        metrics["profile_trace_path"] = trace_path  # rank 0's; the others' lie beside it
    metrics.update({k.replace("_gib", "_rank0_gib"): v for k, v in first[0].items()})
    unit = run.source.unit
    items = ctx.world_size * spec.batch_size * (spec.context_length if unit == "tokens" else 1)
    if metrics["local_step_ms"] is not None:
        metrics["overhead_vs_local_pct"] = 100 * (metrics["step_ms"] / metrics["local_step_ms"] - 1)
    metrics.update(
        device_facts(ctx.device),
        backend_used=ctx.backend,
        parameters=run.parameter_count,
        ddp_settings=run.settings,
        **run.source.facts(),
        **{f"{unit}_per_s": items / (metrics["step_ms"] / 1e3)},
        comm_overhead_pct=(100 * metrics["comm_wait_ms"] / metrics["step_ms"]
                           if metrics["comm_wait_ms"] is not None else None),
    )
    if calibration is not None:
        metrics.update(_prediction(spec, run, calibration, metrics))
    if sharded:
        metrics.update(_sharded_prediction(spec, ctx, metrics))
    # this rank's per-step times (the row is rank 0's): the intervals of the summary's ratios
    metrics["times_ms"] = [round(t, 4) for t in times]
    metrics["local_times_ms"] = [round(t, 4) for t in local_times] if local_times else None
    return metrics


MEMORY_KEYS = ("init_allocated_gib", "peak_after_optimizer_gib", "after_step_allocated_gib")
"""Memory per rank reported for rank 0 too (`<name>_rank0_gib`) beside the mean, min and max."""


def _error_pct(measured: float | None, predicted: float) -> float | None:
    return 100 * (measured - predicted) / predicted if measured is not None and predicted > 0 else None


def _sharded_prediction(spec: Spec, ctx: RankContext, metrics: dict[str, Any]) -> dict[str, Any]:
    """The FSDP accounting beside the measured memory (max over ranks) and bytes, with errors;
    exposed communication as the step beyond the paired unwrapped step on the same ranks. The
    accounting describes lmscope's presets: other sources get the exposed communication only."""
    local = metrics.get("local_step_ms")
    exposed = {"exposed_comm_ms": metrics["step_ms"] - local if local is not None else None}
    if spec.model_config() is None:
        return exposed
    predicted = predict_fsdp(spec.model_config(), world_size=ctx.world_size, batch_size=spec.batch_size,
                             seq_len=spec.context_length, precision=spec.precision,
                             attention=spec.attention, checkpoint=spec.checkpoint, fast=spec.fast,
                             optimizer_state=spec.optimizer_state)
    row: dict[str, Any] = {**predicted.as_record(), **exposed}
    pairs = {
        "init": ("init_allocated_rank_max_gib", row["predicted_fsdp_params_gib"]),
        "peak": ("peak_after_optimizer_rank_max_gib", row["predicted_fsdp_peak_gib"]),
        "after_step": ("after_step_allocated_rank_max_gib", row["predicted_fsdp_state_gib"]),
        "allgather": ("allgather_gib", row["predicted_fsdp_allgather_forward_gib"]
                      + row["predicted_fsdp_allgather_backward_gib"]),
        "reduce_scatter": ("reduce_scatter_gib", row["predicted_fsdp_reduce_scatter_gib"]),
    }
    for name, (key, value) in pairs.items():
        row[f"{name}_error_pct"] = _error_pct(metrics.get(key), value)
    return row


def _time_unwrapped(run: _Setup, spec: Spec, ctx: RankContext) -> list[float] | None:
    """Per-step ms of the unwrapped step on this rank (the paired baseline), None if it ran out of
    memory.

    The unwrapped step keeps the whole AdamW state: a point that fits only with the sharded
    optimizer gets no paired baseline, and its data-parallel step is still measured.
    """
    try:
        unwrapped = time_phased_steps(run.step, warmup=spec.warmup, steps=spec.steps, device=ctx.device)
    except torch.OutOfMemoryError:
        return None
    return unwrapped.times_ms


def _calibrate(ctx: RankContext) -> tuple[float, float] | str:
    """Fit t = o + S / w to all-reduces of two sizes on these ranks: (o in s, w in GB/s).

    When the larger all-reduce timed no slower (noise on a busy host) there is no fit: the
    reason comes back instead, and the point keeps its measured step without the prediction.
    """
    sizes = CALIBRATION_BYTES["cuda" if ctx.device.type == "cuda" else "cpu"]
    medians = {}
    for nbytes in sizes:
        buffer = torch.zeros(int(nbytes) // 4, dtype=torch.float32, device=ctx.device)
        times = time_calls(lambda b=buffer: dist.all_reduce(b), warmup=2, iters=5, device=ctx.device)
        medians[f"calibration_{int(nbytes)}_ms"] = statistics.median(times)
        del buffer
    means = across_ranks(medians)
    try:
        return fit_latency_bandwidth(list(sizes), [means[key] / 1e3 for key in medians])
    except ValueError as error:
        return f"no overhead-model prediction: {error}"


def _bucket_bytes(spec: Spec, grads: list[int]) -> tuple[list[float], bool]:
    """Bytes per all-reduce in launch order, and whether they overlap with backward."""
    name, bucket_mib = parse_strategy(spec.strategy)
    if name == "naive":
        return [float(b) for b in grads], False
    if name == "flat":
        return [float(sum(grads))], False
    if name == "overlap":
        return [float(b) for b in grads], True
    head: list[float] = []
    if bucket_mib is None:  # torch-ddp with PyTorch's default caps: 1 MiB first, then 25 MiB
        first = plan_buckets(grads, TORCH_DDP_FIRST_BUCKET_MB * MIB)[0]
        head, grads = [float(sum(grads[i] for i in first))], grads[len(first):]
        bucket_mib = TORCH_DDP_BUCKET_MB
    rest = [float(sum(grads[i] for i in bucket)) for bucket in plan_buckets(grads, bucket_mib * MIB)]
    return head + rest, True


def _prediction(spec: Spec, run: _Setup, calibration: tuple[float, float] | str,
                metrics: dict[str, Any]) -> dict[str, Any]:
    """This strategy's gradient bytes and all-reduces and, when the calibration fitted, the
    overhead model's exposed communication beside the measurement (else why not)."""
    grads = [p.numel() * p.element_size() for p in run.model.parameters() if p.requires_grad][::-1]
    buckets, overlap = _bucket_bytes(spec, grads)
    model_bytes = float(sum(grads))
    facts = {"grad_mib": model_bytes / MIB, "buckets": len(buckets)}
    if isinstance(calibration, str):
        return {**facts, "calibration_error": calibration}
    overhead_s, algbw = calibration
    predicted_ms = 1e3 * exposed_comm_s(buckets, algbw=algbw, overhead_s=overhead_s, overlap=overlap,
                                        backward_s=metrics["backward_ms"] / 1e3)
    measured = metrics["comm_wait_ms"]
    return {
        **facts,
        "allreduce_overhead_us": overhead_s * 1e6,
        "allreduce_algbw_gbps": algbw,
        "predicted_comm_wait_ms": predicted_ms,
        "comm_wait_error_pct": (100 * (measured - predicted_ms) / predicted_ms
                                if measured is not None and predicted_ms > 0 else None),
        "optimal_buckets": optimal_bucket_count(model_bytes, algbw, overhead_s) if overhead_s > 0 else None,
        "optimal_bucket_mib": (optimal_bucket_bytes(model_bytes, algbw, overhead_s) / MIB
                               if overhead_s > 0 else None),
    }
