"""`lmscope comm`: time one collective at one size on N ranks, the way nccl-tests does.

Buffers follow nccl-tests: the size S of a point is the per-rank buffer for all-reduce and
broadcast and the total (gathered / scattered) buffer for all-gather and reduce-scatter, whose
per-rank piece is S / N. After `warmup` untimed calls, `iters` calls are timed one by one with
CUDA events around each call on the rank's stream (a host clock on CPU), after a barrier and a
synchronize; a rank's time is its mean over the calls and the point's time the mean over ranks
(min and max over ranks beside it). algbw = S / t and busbw = algbw x nccl-tests' factor
(`lmscope.accounting.comms`). A separate call on known data then counts the wrong elements of
the result on every rank (`wrong`, summed over ranks; nccl-tests' #wrong).
"""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from lmscope.accounting.comms import algbw_gbps, bus_factor
from lmscope.inputs.limits import check_steps, check_timeout
from lmscope.measure.timer import synchronize
from lmscope.parallel.launch import RankContext, across_ranks, check_world, launch, point_id
from lmscope.workloads.collective_choices import COMM_DTYPES, check_collective, check_comm_dtype
from lmscope.workloads.train_step import device_facts

DTYPES = {name: getattr(torch, name) for name in COMM_DTYPES}


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One collective at one size on one world size."""

    RUN_OPTIONS: ClassVar[tuple[str, ...]] = ("timeout_s",)
    """Fields that change how the point runs, not what it measures (left out of its identity)."""

    op: str = "all-reduce"
    """all-reduce | all-gather | reduce-scatter | broadcast."""
    size_mb: float = 1.0
    """Buffer size S in decimal MB (per rank; total for all-gather and reduce-scatter)."""
    world_size: int = 2
    """Number of ranks."""
    backend: str = "auto"
    """auto (nccl with GPUs, else gloo) | gloo | nccl."""
    dtype: str = "float32"
    """Element type: float32 | float16 | bfloat16 | float64."""
    warmup: int = 5
    """Untimed calls first."""
    iters: int = 20
    """Timed calls."""
    timeout_s: float = 300.0
    """A rank that fails or hangs ends the point within this many seconds."""

    def __post_init__(self) -> None:
        check_collective(self.op)
        check_comm_dtype(self.dtype)
        check_world(self.world_size, self.backend)
        if not (isinstance(self.size_mb, int | float) and self.size_mb > 0):
            raise ValueError(f"size must be positive, got {self.size_mb!r}: pass --size 1MB,1GB")
        itemsize = DTYPES[self.dtype].itemsize
        if self.size_mb * 1e6 < itemsize * self.world_size:
            raise ValueError(
                f"size {self.size_mb:g} MB holds fewer than one {self.dtype} per rank "
                f"for {self.world_size} ranks: pass a larger --size"
            )
        check_steps("warmup", self.warmup, 0, "calls")
        check_steps("iters", self.iters, 1, "calls")
        check_timeout(self.timeout_s)

    def element_counts(self) -> tuple[int, int]:
        """(elements per rank, elements of S): equal for all-reduce and broadcast."""
        count = int(self.size_mb * 1e6) // DTYPES[self.dtype].itemsize
        if self.op in ("all-gather", "reduce-scatter"):
            per_rank = count // self.world_size
            return per_rank, per_rank * self.world_size
        return count, count


def run_point(point: dict[str, Any]) -> dict[str, Any]:
    """Start the ranks, measure, return the metrics aggregated over ranks."""
    spec = Spec(**point)
    return launch(measure, asdict(spec), nproc=spec.world_size, backend=spec.backend,
                  timeout_s=spec.timeout_s, run_id=point_id("comm", asdict(spec)))


def pattern(rank: int, count: int, offset: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Known data of a rank: small integers (-5..5), exact in every dtype and in sums of ranks."""
    index = torch.arange(offset, offset + count, device=device, dtype=torch.int64)
    return ((index * 7 + rank * 3) % 11 - 5).to(dtype)


def _summed(world: int, count: int, offset: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    total = pattern(0, count, offset, dtype, device)
    for rank in range(1, world):
        total += pattern(rank, count, offset, dtype, device)
    return total


@dataclass
class Collective:
    """One collective on this rank's buffers: the call, how to load known data, the answer."""

    call: Callable[[], object]
    """One call of the collective (what is timed)."""
    prepare: Callable[[], object]
    """Put the known data in the input and NaN in an output that is not the input."""
    result: torch.Tensor
    """The buffer the call writes its result to."""
    expected: Callable[[], torch.Tensor]
    """What `result` must hold after `prepare(); call()`."""


def collective(spec: Spec, ctx: RankContext) -> Collective:
    """Buffers of `spec` on this rank, laid out as nccl-tests does."""
    dtype, device, rank, world = DTYPES[spec.dtype], ctx.device, ctx.rank, ctx.world_size
    per_rank, total = spec.element_counts()
    if spec.op == "all-reduce":
        buffer = pattern(rank, per_rank, 0, dtype, device)
        return Collective(
            lambda: dist.all_reduce(buffer),
            lambda: buffer.copy_(pattern(rank, per_rank, 0, dtype, device)),
            buffer,
            lambda: _summed(world, per_rank, 0, dtype, device),
        )
    if spec.op == "broadcast":
        buffer = pattern(rank, per_rank, 0, dtype, device)
        return Collective(
            lambda: dist.broadcast(buffer, src=0),
            lambda: buffer.copy_(pattern(0, per_rank, 0, dtype, device)) if rank == 0
            else buffer.fill_(float("nan")),
            buffer,
            lambda: pattern(0, per_rank, 0, dtype, device),
        )
    if spec.op == "all-gather":
        piece = pattern(rank, per_rank, rank * per_rank, dtype, device)
        gathered = torch.empty(total, dtype=dtype, device=device)
        return Collective(
            lambda: dist.all_gather_into_tensor(gathered, piece),
            lambda: gathered.fill_(float("nan")),
            gathered,
            lambda: torch.cat([pattern(r, per_rank, r * per_rank, dtype, device) for r in range(world)]),
        )
    full = pattern(rank, total, 0, dtype, device)
    scattered = torch.empty(per_rank, dtype=dtype, device=device)
    return Collective(
        lambda: dist.reduce_scatter_tensor(scattered, full),
        lambda: scattered.fill_(float("nan")),
        scattered,
        lambda: _summed(world, per_rank, rank * per_rank, dtype, device),
    )


def time_calls(call: Callable[[], None], *, warmup: int, iters: int, device: torch.device) -> list[float]:
    """Per-call times in ms after `warmup` calls: CUDA events around each call, or the host clock."""
    for _ in range(warmup):
        call()
    synchronize(device)
    dist.barrier()
    synchronize(device)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(iters)]
        for start, end in events:
            start.record()
            call()
            end.record()
        synchronize(device)
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(iters):
        begin = timeit.default_timer()
        call()
        times.append((timeit.default_timer() - begin) * 1e3)
    return times


def measure(ctx: RankContext, point: dict[str, Any]) -> dict[str, Any]:
    """On every rank: time the collective, check one result, aggregate over ranks."""
    spec = Spec(**{**point, "backend": ctx.backend})
    op = collective(spec, ctx)
    times = time_calls(op.call, warmup=spec.warmup, iters=spec.iters, device=ctx.device)
    op.prepare()
    op.call()
    wrong = (op.result != op.expected()).sum()
    dist.all_reduce(wrong)
    summary = across_ranks({"time_ms": statistics.fmean(times), "time_median_ms": statistics.median(times)})
    per_rank, total = spec.element_counts()
    count = total if spec.op in ("all-gather", "reduce-scatter") else per_rank
    nbytes = count * DTYPES[spec.dtype].itemsize
    algbw = algbw_gbps(nbytes, summary["time_ms"] / 1e3)
    factor = bus_factor(spec.op, ctx.world_size)
    return {
        **device_facts(ctx.device),
        "backend_used": ctx.backend,
        "count": count,
        "bytes": nbytes,
        **summary,
        "algbw_gbps": algbw,
        "bus_factor": factor,
        "busbw_gbps": algbw * factor,
        "wrong": int(wrong.item()),
    }
