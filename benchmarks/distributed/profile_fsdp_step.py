"""Where one FSDP training step of the fast model spends its GPU time, from a torch.profiler trace.

The step is the one `lmscope ddp --strategy fsdp --fast on --checkpoint POLICY` times (or
`--strategy fsdp:separate-reduce`) (the same
setup code: `lmscope.workloads.ddp`), on --nproc local ranks; rank 0 records --steps steps after
--warmup plain ones and reads its trace:

* compute: the union of the intervals of every kernel that is not communication or a copy;
* exposed communication: time NCCL kernels run while no compute kernel does (the union of
  compute and communication, less compute's); exposed copies likewise (offload's memcpys);
* idle: the step's wall time with no kernel at all (host-bound gaps);
* recompute, rebuild, optimizer, forward, backward (`<name>_gpu_ms`): GPU time of the compute
  kernels launched inside the `recompute` ranges (checkpointed blocks' forward rerun in the
  backward), the `rebuild` ranges (selective recompute's rebuilt tensors) and the step's phases,
  each also as a share of compute (`<name>_share_pct`).

Appends one row (these fields per step, medians; the policy, provenance; a failed or
out-of-memory run is a row too) to the JSONL file --out with `lmscope.results.append_record` (a
row never merges into a line a killed writer left cut off) and writes the trace beside it
(`<out>.trace.json.gz`, Perfetto opens it). For example, the 8B long-context step:

    PYTHONPATH=src python3 benchmarks/distributed/profile_fsdp_step.py --nproc 2 --d-model 4096 \
        --d-ff 11008 --num-layers 34 --num-heads 32 --vocab-size 151936 --context-length 32768 \
        --batch-size 1 --attention flash --checkpoint block --out $OUT/profile-8b.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from lmscope.accounting.fsdp import OPTIMIZER_STATES
from lmscope.measure.kernel_categories import classify
from lmscope.measure.kernels import STEP, Activity, Trace, load_trace, record_trace, union_ns
from lmscope.measure.timer import PhaseClock, synchronize
from lmscope.model.checkpointing import RECOMPUTE_RANGE
from lmscope.model.saved_tensors import REBUILD_RANGE
from lmscope.parallel.launch import RankContext, launch
from lmscope.parallel.strategies import SEPARATE_REDUCE
from lmscope.records.results import append_record, provenance
from lmscope.workloads.ddp import Spec, _Setup

RANGES = {"recompute": RECOMPUTE_RANGE, "rebuild": REBUILD_RANGE, "optimizer": "optimizer",
          "forward": "forward", "backward": "backward"}


def profile(ctx: RankContext, args: dict[str, Any]) -> dict[str, Any] | None:
    spec = Spec(size="small", d_model=args["d_model"], d_ff=args["d_ff"], num_layers=args["num_layers"],
                num_heads=args["num_heads"], vocab_size=args["vocab_size"],
                context_length=args["context_length"], batch_size=args["batch_size"], precision="bf16",
                attention=args["attention"], fast=True, strategy=args["strategy"],
                checkpoint=args["checkpoint"], optimizer_state=args["optimizer_state"],
                world_size=ctx.world_size, backend=ctx.backend)
    run = _Setup(spec, ctx)
    run.wrap()
    clock = PhaseClock(ctx.device)
    for _ in range(args["warmup"]):
        run.step(clock)
    synchronize(ctx.device)
    trace_path = Path(args["out"]).with_suffix(".trace.json.gz")  # under the out file's folder
    if ctx.rank != 0:
        for _ in range(args["steps"] + 1):  # record_trace's profiler warm-up step, then the steps
            run.step(clock)
        synchronize(ctx.device)
        return None
    times = record_trace(lambda: run.step(clock), steps=args["steps"], device=ctx.device, path=trace_path)
    return {"policy": args["checkpoint"], "profiled_step_ms": statistics.median(times),
            "trace": str(trace_path), **breakdown(load_trace(trace_path))}


def breakdown(trace: Trace) -> dict[str, float]:
    """Per-step medians (ms) of compute, exposed communication and copies, idle time, and the GPU
    time launched inside each of RANGES, with shares of compute."""
    rows: list[dict[str, float]] = []
    for step in trace.spans_named(STEP):
        acts = trace.launched_in(step.start_ns, step.end_ns)
        compute = [a for a in acts if classify(a.name) not in ("communication", "memcpy")]
        comm = [a for a in acts if classify(a.name) == "communication"]
        copies = [a for a in acts if classify(a.name) == "memcpy"]
        busy = union_ns(compute)
        row = {"step_wall_ms": step.dur_ns / 1e6, "compute_ms": busy / 1e6,
               "exposed_comm_ms": (union_ns(compute + comm) - busy) / 1e6,
               "exposed_copy_ms": (union_ns(compute + copies) - busy) / 1e6,
               "comm_kernel_ms": sum(a.dur_ns for a in comm) / 1e6,
               "idle_ms": (step.dur_ns - union_ns(acts)) / 1e6}
        for name, range_name in RANGES.items():
            row[f"{name}_gpu_ms"] = _launched_in_ranges(trace, range_name, step, compute) / 1e6
            row[f"{name}_share_pct"] = 100 * row[f"{name}_gpu_ms"] / row["compute_ms"] if busy else 0.0
        rows.append(row)
    return {key: statistics.median(r[key] for r in rows) for key in rows[0]} if rows else {}


def _launched_in_ranges(trace: Trace, name: str, step: Any, compute: list[Activity]) -> int:
    """GPU ns of the compute kernels launched inside the ranges called `name` within `step`."""
    kinds = {id(a) for a in compute}
    return sum(a.dur_ns for span in trace.spans_named(name, within=step)
               for a in trace.launched_in(span.start_ns, span.end_ns) if id(a) in kinds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("nproc", 2), ("d-model", 4096), ("d-ff", 11008), ("num-layers", 34),
                          ("num-heads", 32), ("vocab-size", 151936), ("context-length", 32768),
                          ("batch-size", 1), ("warmup", 1), ("steps", 1)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--attention", default="flash")
    parser.add_argument("--checkpoint", default="block")
    parser.add_argument("--strategy", default="fsdp", choices=("fsdp", SEPARATE_REDUCE),
                        help="lmscope's FSDP, or with the reduce-scatters on a group of their own")
    parser.add_argument("--optimizer-state", default="device", choices=OPTIMIZER_STATES,
                        help="where AdamW's moments live (host: lmscope.parallel.host_adamw)")
    parser.add_argument("--timeout", type=float, default=540.0)
    parser.add_argument("--out", required=True)
    args = vars(parser.parse_args())
    row: dict[str, Any] = {**provenance(), "world_size": args["nproc"],
                           **{k: v for k, v in args.items() if k not in ("out", "timeout", "nproc")}}
    try:
        row.update(launch(profile, args, nproc=args["nproc"], backend="auto", timeout_s=args["timeout"],
                          preload=["torch._dynamo"]), status="ok")
    except Exception as error:  # a failed rank or an OOM is a row too
        row.update(status="oom" if "out of memory" in str(error).lower() else "error",
                   error=str(error).splitlines()[0][:300])
    append_record(Path(args["out"]), row)
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()
                      if k.endswith(("_ms", "_pct")) or k in ("policy", "status", "error")}, indent=1))


if __name__ == "__main__":
    main()
