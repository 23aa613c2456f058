"""The study's sections: for each question, the Specs that answer it on this target.

A section is one question, one workload and a list of points, each with a tier: tier 0 is the
smallest point that still answers the question, higher tiers add sizes, contexts and variants.
The planner spends a budget tier by tier across all sections, so a short budget gives every
section its first point before any section its last. On a CPU the points use tiny models that
finish in minutes; on a GPU the study's sizes (small..2.7B, context 128..1024).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmscope.study.target import Target

GPU_SIZES = ("small", "medium", "large", "xl", "2.7B")
GPU_CONTEXTS = (128, 256, 512, 1024)
MODES = ("forward", "forward-backward", "train-step")
FLASH_TORCH_MAX_SEQ = 4096
"""Longest sequence the GPU study times the tiled PyTorch FlashAttention at: it runs one Python
iteration per tile pair, so longer ones cost minutes of a study run and teach nothing new (the
H100 study's rows: benchmarks/results/study-h100/attention.jsonl)."""
ACCOUNTING = "lmscope.study.accounting_point"
PRECISION_CHECKS = "lmscope.study.precision_point"


@dataclass(frozen=True)
class Point:
    """One spec (a workload Spec dataclass) and the tier it belongs to."""

    spec: Any
    tier: int


@dataclass(frozen=True, kw_only=True)
class Section:
    """One question of the study, answered by one workload's points in one JSONL."""

    name: str
    """Short name: the JSONL is <name>.jsonl in the run directory."""
    question: str
    """What the section answers, as the report's heading."""
    workload: str
    """A runner workload name or module path."""
    points: list[Point] = field(default_factory=list)
    """The points, in the order they run."""
    reuse_worker: bool = True
    """Run consecutive points in one worker (False where a cold process is the point)."""
    skip_reason: str | None = None
    """Why the section does not run on this target (None: it runs)."""
    device_work: bool = True
    """False for points that only compute (accounting): they cost no budget and always run."""

    @property
    def file(self) -> str:
        """The section's results file name."""
        return f"{self.name}.jsonl"

    @property
    def variables(self) -> list[str]:
        """The spec fields its points differ in (the question's variables), in spec order: the
        report shows them even where only one of the points has a row yet."""
        specs = [spec_fields(p) for p in self.points]
        return [k for k in (specs[0] if specs else {})
                if len({json.dumps(s.get(k), default=str) for s in specs}) > 1]


def _bench(**fields: Any) -> Any:
    from lmscope.workloads.step import Spec

    # exactly `steps` timed steps (no --target-ci): the plan fits its budget from step counts
    return Spec(**{"target_ci": 0.0, **fields})


def _profile(**fields: Any) -> Any:
    from lmscope.workloads.profile import Spec

    return Spec(**fields)


def _memory(**fields: Any) -> Any:
    from lmscope.workloads.memory import Spec

    return Spec(**fields)


def _attention(**fields: Any) -> Any:
    from lmscope.workloads.attention import Spec

    return Spec(**fields)


def _tier_of_size(size: str) -> int:
    return {"small": 0, "medium": 1, "large": 1, "xl": 2, "2.7B": 2}.get(size, 0)


def build_sections(target: Target, run_dir: Path) -> list[Section]:
    """Every section of the study for `target`, artifacts under `run_dir`."""
    builder = _gpu_sections if target.on_gpu else _cpu_sections
    return builder(target, run_dir)


def _cpu_sections(target: Target, run_dir: Path) -> list[Section]:
    device = "cpu"
    tiny = dict(size="tiny", batch_size=2, device=device)
    wide = dict(size="tiny", d_model=128, d_ff=384, num_layers=4, num_heads=4, batch_size=2, device=device)
    timing = [
        Point(
            _bench(**model, context_length=ctx, mode=mode, warmup=2, steps=5),
            0 if (model is tiny and ctx == 64) else 1,
        )
        for model in (tiny, wide)
        for ctx in ((64, 128, 256) if model is tiny else (64, 128))
        for mode in MODES
    ]
    warmup = [
        Point(_bench(**tiny, context_length=128, mode="train-step", warmup=w, steps=5), 0 if w == 0 else 1)
        for w in (0, 1, 2, 5)
    ]
    precision = [
        Point(
            _bench(**tiny, context_length=128, mode=mode, precision=p, warmup=2, steps=5),
            0 if mode == "train-step" else 1,
        )
        for mode in ("forward", "train-step")
        for p in ("fp32", "bf16")
    ]
    return [
        Section(name="timing", question=TIMING_Q, workload="bench", points=timing),
        Section(name="warmup", question=WARMUP_Q, workload="bench", points=warmup, reuse_worker=False),
        Section(name="precision", question=PRECISION_Q, workload="bench", points=precision),
        Section(
            name="precision_checks",
            question=CHECKS_Q,
            workload=PRECISION_CHECKS,
            points=_precision_checks(device),
        ),
        Section(
            name="kernels",
            question=KERNELS_CPU_Q,
            workload="profile",
            points=[
                Point(
                    _profile(
                        **tiny,
                        context_length=128,
                        mode=mode,
                        warmup=2,
                        steps=2,
                        artifacts_dir=str(run_dir / "profile"),
                    ),
                    0 if mode == "forward" else 1,
                )
                for mode in ("forward", "train-step")
            ],
        ),
        Section(
            name="memory",
            question=MEMORY_Q,
            workload="memory",
            points=[
                Point(
                    _memory(
                        **tiny,
                        context_length=ctx,
                        mode="train-step",
                        checkpoint=ck,
                        warmup=1,
                        steps=1,
                        artifacts_dir=str(run_dir / "memory"),
                    ),
                    0 if ctx == 64 else 1,
                )
                for ctx, ck in ((64, "none"), (128, "none"), (128, "block"))
            ],
        ),
        Section(
            name="attention",
            question=ATTENTION_Q,
            workload="attention",
            points=[
                Point(
                    _attention(
                        impl=impl,
                        batch=2,
                        heads=1,
                        head_dim=32,
                        seq_len=seq,
                        dtype="fp32",
                        cpu_steps=2,
                        check_max_seq=256,
                        device=device,
                    ),
                    0 if seq == 128 and impl != "naive-compiled" else (2 if impl == "naive-compiled" else 1),
                )
                for seq in (128, 256, 512)
                for impl in ("naive", "flash-torch", "sdpa-math", "naive-compiled")
                if impl != "naive-compiled" or seq == 256
            ],
        ),
        Section(
            name="compile",
            question=COMPILE_Q,
            workload="bench",
            points=[
                Point(
                    _bench(**tiny, context_length=128, mode="train-step", compile=c, warmup=2, steps=5),
                    int(c),
                )
                for c in (False, True)
            ],
        ),
        *_distributed(target),
        Section(name="accounting", question=ACCOUNTING_Q, workload=ACCOUNTING, points=_accounting(),
                device_work=False),
    ]


def _gpu_sections(target: Target, run_dir: Path) -> list[Section]:
    timing = [
        Point(_bench(size=s, context_length=ctx, mode=m, precision="fp32"), _tier_of_size(s) + (ctx > 256))
        for s in GPU_SIZES
        for ctx in GPU_CONTEXTS
        for m in MODES
    ]
    warmup = [
        Point(_bench(size="small", context_length=128, mode="train-step", warmup=w), 0 if w == 0 else 1)
        for w in (0, 1, 2, 5)
    ]
    precision = [
        Point(_bench(size=s, context_length=ctx, mode=m, precision="bf16"), _tier_of_size(s) + (ctx > 256))
        for s in GPU_SIZES
        for ctx in GPU_CONTEXTS
        for m in MODES
    ]
    kernels = [
        Point(
            _profile(
                size="large",
                context_length=ctx,
                mode=m,
                precision=p,
                warmup=3,
                steps=3,
                artifacts_dir=str(run_dir / "profile"),
            ),
            0 if (m, p) == ("forward", "fp32") else 1,
        )
        for ctx in (128, 512)
        for m in ("forward", "train-step")
        for p in ("fp32", "bf16")
        if ctx == 128 or p == "bf16"
    ]
    memory = [
        Point(
            _memory(
                size="2.7B",
                context_length=ctx,
                mode=m,
                precision="bf16",
                checkpoint="none",
                snapshot=ctx == 512,
                artifacts_dir=str(run_dir / "memory"),
            ),
            0 if ctx == 128 else 1,
        )
        for ctx in (128, 256, 512)
        for m in ("forward", "train-step")
    ]
    memory += [
        Point(
            _memory(
                size="xl",
                context_length=512,
                mode="train-step",
                precision="bf16",
                checkpoint=ck,
                snapshot=False,
                artifacts_dir=str(run_dir / "memory"),
            ),
            1,
        )
        for ck in ("none", "block")
    ]
    attention = [
        Point(
            _attention(impl=impl, batch=8, heads=1, head_dim=64, seq_len=seq, dtype=dtype),
            0 if seq == 1024 else (1 if seq <= 8192 else 2),
        )
        for dtype in ("bf16", "fp32")
        for seq in (256, 1024, 4096, 8192, 16384)
        for impl in ("naive", "naive-compiled", "flash-torch", "flash-triton", _sdpa_peer(dtype))
        if impl != "flash-torch" or seq <= FLASH_TORCH_MAX_SEQ
    ]
    compiled = [
        Point(
            _bench(size=s, context_length=512, mode="train-step", precision="bf16", compile=c),
            {"small": 0, "medium": 1, "large": 2}[s],
        )
        for s in ("small", "medium", "large")
        for c in (False, True)
    ]
    return [
        Section(name="timing", question=TIMING_Q, workload="bench", points=timing),
        Section(name="warmup", question=WARMUP_Q, workload="bench", points=warmup, reuse_worker=False),
        Section(name="precision", question=PRECISION_Q, workload="bench", points=precision),
        Section(
            name="precision_checks",
            question=CHECKS_Q,
            workload=PRECISION_CHECKS,
            points=_precision_checks("cuda"),
        ),
        Section(name="kernels", question=KERNELS_Q, workload="profile", points=kernels),
        Section(name="memory", question=MEMORY_Q, workload="memory", points=memory, reuse_worker=False),
        Section(name="attention", question=ATTENTION_Q, workload="attention", points=attention),
        Section(name="compile", question=COMPILE_Q, workload="bench", points=compiled),
        *_distributed(target),
        Section(name="accounting", question=ACCOUNTING_Q, workload=ACCOUNTING, points=_accounting(),
                device_work=False),
    ]


def _sdpa_peer(dtype: str) -> str:
    """SDPA's fused kernel for the dtype: FlashAttention-2 takes only 16-bit inputs, so fp32 goes to
    the memory-efficient kernel (what SDPA itself picks for fp32)."""
    return "sdpa-flash" if dtype in ("bf16", "fp16") else "sdpa-efficient"


def _precision_checks(device: str) -> list[Point]:
    from lmscope.study.precision_point import Spec

    return [Point(Spec(check="accumulate", count=n, device=device), 0) for n in (1000, 10000)] + [
        Point(Spec(check="autocast", model=m, dtype="bf16", device=device), 0 if m == "toy" else 1)
        for m in ("toy", "tiny")
    ]


def _accounting() -> list[Point]:
    from lmscope.config import preset
    from lmscope.study.accounting_point import Spec

    meshes = ((8, 1, 1), (1, 8, 1), (1, 4, 2), (1, 2, 4))
    return [
        Point(Spec(model=m, dp=dp, fsdp=fsdp, tp=tp), 0 if m == "xl" else 1)
        for m in ("xl", "2.7B")
        for dp, fsdp, tp in meshes
        if _shardable(preset(m), tp)  # xl's 25 heads admit no TP of 2 or 4: plan parallel refuses it
    ]


def _shardable(config: Any, tp: int) -> bool:
    """Whether tensor parallelism `tp` splits the model into whole heads and equal FFN shards."""
    return config.num_heads % tp == 0 and config.d_ff % tp == 0


def _distributed(target: Target) -> list[Section]:
    """Collectives, then DDP strategies of xl at context 512, on 2 GPUs (skipped below 2 GPUs)."""
    if target.gpus < 2:
        reason = f"needs 2+ GPUs ({target.gpus} here)"
        return [
            Section(name="comm", question=DISTRIBUTED_Q, workload="comm", skip_reason=reason),
            Section(name="ddp", question=DDP_Q, workload="ddp", skip_reason=reason),
        ]
    from lmscope.inputs.grid import ddp_points
    from lmscope.workloads.collectives import Spec as CommSpec
    from lmscope.workloads.ddp import Spec

    comm = Section(
        name="comm",
        question=DISTRIBUTED_Q,
        workload="comm",
        points=[
            Point(CommSpec(op=op, size_mb=mb, world_size=2, timeout_s=120.0), 0 if mb == 1.0 else 1)
            for op in ("all-reduce", "all-gather", "reduce-scatter")
            for mb in (1.0, 10.0, 100.0, 1000.0)
        ],
    )

    fixed = dict(
        size="xl", context_length=512, batch_size=4, precision="bf16", warmup=3, steps=10, timeout_s=300.0
    )
    swept = {
        "world_size": [2],
        "strategy": ["naive", "flat", "overlap", "bucketed:25", "torch-ddp"],
        "shard_optimizer": [False],
    }
    ddp = Section(
        name="ddp",
        question=DDP_Q,
        workload="ddp",
        reuse_worker=False,
        points=[
            Point(Spec(**p), 0 if p["strategy"] in ("single", "bucketed:25") else 1)
            for p in ddp_points(fixed, swept)
        ],
    )
    return [comm, ddp]


def spec_fields(point: Point) -> dict[str, Any]:
    """The point's spec as a plain dict."""
    return dataclasses.asdict(point.spec)


TIMING_Q = "How long does a step take, by model size, context length and mode?"
WARMUP_Q = "What do warm-up steps change in the mean and spread of step times?"
PRECISION_Q = "What does bf16 autocast buy over fp32 in step time and memory?"
CHECKS_Q = "Why do sums stay in fp32, and which dtype does each tensor take under autocast?"
KERNELS_Q = "Where does a step's GPU time go, kernel by kernel and phase by phase?"
KERNELS_CPU_Q = "Where does a step's CPU time go, op by op and phase by phase?"
MEMORY_Q = "How much memory does each phase of a step peak at, against the model's prediction?"
ATTENTION_Q = "How do attention implementations compare: naive, compiled and flash?"
COMPILE_Q = "What does torch.compile of the whole model buy?"
DISTRIBUTED_Q = "How fast are collectives (busbw) between this host's GPUs?"
DDP_Q = "What does each data-parallel strategy cost over the single-GPU step?"
ACCOUNTING_Q = "What would a sharded run need: memory per device, bytes per step, compute or comm bound?"
