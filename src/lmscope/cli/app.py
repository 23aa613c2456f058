"""The `lmscope` command line: one thin function per command (flags -> specs -> runner).

The commands that run points are here; `plan` and `precision` are in `plan_commands.py`, the
flag parsing in `flags.py`, the sweep-and-table glue in `sweep.py` (`distributed_sweeps.py` for
`comm` and `ddp`).

A user's mistake (unknown flag, bad value, impossible size) ends in one line on stderr and
exit code 2, never a traceback.
"""

from __future__ import annotations

import inspect
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from lmscope.cli.flags import model_axes, model_flag, model_grid, split_list
from lmscope.cli.plan_commands import plan_app, precision_app
from lmscope.cli.sweep import check_format, exit_status, run_and_report, show
from lmscope.inputs.grid import expand_grid
from lmscope.report import console
from lmscope.running.runner import spec_fields

app = typer.Typer(
    name="lmscope",
    help="Measure, profile and speed up the training step of Transformer language models.",
    no_args_is_help=False,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

Out = Annotated[Path | None, typer.Option(help="results JSONL (default runs/<time>/results.jsonl)")]
Resume = Annotated[bool, typer.Option(help="skip points already finished in --out")]
Timeout = Annotated[float, typer.Option(help="seconds allowed per point")]
Format = Annotated[str | None, typer.Option("--format", help="also write md | csv | latex | json")]
Compare = Annotated[str | None, typer.Option(help="pivot a swept field into columns, with ratios")]
CompareBase = Annotated[str | None, typer.Option(
    help="the --compare value ratios are taken against (default: the first one with ok rows)")]
ReuseWorker = Annotated[
    bool, typer.Option(help="run consecutive points in one worker process (a failure replaces it)")
]
Rounds = Annotated[int, typer.Option(
    help="run the list of points this many times, interleaved (A,B,A,B), each round in fresh worker "
    "processes; tables pool the rounds and their intervals resample them")]
Round = Annotated[int | None, typer.Option("--round", help=(
    "run only this round (0..R-1) of --rounds R: interleave commands that cannot share one "
    "sweep by calling each once per round, into one --out"))]

# Options shared by the commands that run the Transformer LM (bench, profile, memory, ddp).
ModelOpt = Annotated[str | None, typer.Option(
    "--model", help="model source(s), list ok: a preset (tiny,small,medium,large,xl,2.7B,xl-2025,10b-2025,"
    "8b-long: lmscope plan presets), hf:<model_type or config.json> (random weights, no download), or "
    "<module or file.py>:<factory>")]
Size = Annotated[str | None, typer.Option(help="alias of --model (presets)")]
DModel = Annotated[int | None, typer.Option(help="override d_model")]
DFf = Annotated[int | None, typer.Option(help="override d_ff")]
NumLayers = Annotated[int | None, typer.Option(help="override num_layers")]
NumHeads = Annotated[int | None, typer.Option(help="override num_heads")]
VocabSize = Annotated[int | None, typer.Option(help="override vocab_size")]
ContextLength = Annotated[str, typer.Option(help="tokens per sequence, list ok")]
ModelContextLength = Annotated[
    int | None, typer.Option(help="the model's context_length (default: --context-length)")
]
BatchSize = Annotated[str, typer.Option(help="sequences per batch, list ok")]
Mode = Annotated[str, typer.Option(help="forward | forward-backward | train-step, list ok")]
Precision = Annotated[str, typer.Option(help="fp32 | bf16 | fp16, list ok")]
Compile = Annotated[str, typer.Option("--compile", help="torch.compile of the model: off | on (default "
                                      "mode) | max-autotune-no-cudagraphs | reduce-overhead (CUDA graphs), "
                                      "list ok")]
CompileScope = Annotated[str, typer.Option("--compile-scope", help="what --compile compiles: model | blocks "
                                           "(each block, compiled once for all: far shorter cold "
                                           "compiles), list ok")]
Fast = Annotated[str, typer.Option("--fast", help="lmscope's fused fast path: off | on | off,on")]
OptimizerInBackward = Annotated[str, typer.Option(
    "--optimizer-in-backward", help="with --fast on (bf16): update each weight inside the backward, "
    "overlapped with it: off | on | off,on")]
Attention = Annotated[str, typer.Option(help="naive | sdpa | sdpa-cudnn | flash | flash-torch, list ok")]
Device = Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")]


def _show_version(value: bool) -> None:
    if value:
        from lmscope.records.version import version_line

        console.say(version_line())
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_show_version,
                                          help="print lmscope's version and git sha, then exit")] = False,
) -> None:
    """Measure, profile and speed up the training step of Transformer language models."""


@app.command()
def bench(
    model: ModelOpt = None,
    size: Size = None,
    d_model: DModel = None,
    d_ff: DFf = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
    context_length: ContextLength = "128",
    model_context_length: ModelContextLength = None,
    batch_size: BatchSize = "4",
    mode: Mode = "train-step",
    precision: Precision = "fp32",
    compile: Compile = "off",
    compile_scope: CompileScope = "model",
    attention: Attention = "naive",
    fast: Fast = "off",
    optimizer_in_backward: OptimizerInBackward = "off",
    peer: Annotated[str, typer.Option(help="none | hf (a preset as transformers' Llama) | liger "
                                      "(Liger-Kernel on an hf: model), list ok")] = "none",
    checkpoint: Annotated[str, typer.Option(help="activation checkpointing of the blocks: none | block | "
                                            "every:K")] = "none",
    cuda_graph: Annotated[str, typer.Option(
        "--cuda-graph", help="replay the step from CUDA graphs: auto (on with --fast on a GPU) | on | off, "
        "list ok")] = "auto",
    warmup: Annotated[str, typer.Option(help="untimed steps before measuring, list ok")] = "5",
    steps: Annotated[int, typer.Option(help="timed steps (the minimum with --target-ci)")] = 10,
    target_ci: Annotated[str, typer.Option(
        help="keep timing until the median's 95 % interval is within +- this share of it "
        "(0.01: 1 %), or --max-time runs out; off: exactly --steps")] = "0.01",
    max_time: Annotated[float, typer.Option(
        help="seconds the timed steps of a point may take while --target-ci is not reached")] = 10.0,
    device: Device = "auto",
    out: Out = None,
    resume: Resume = False,
    timeout: Timeout = 900.0,
    fmt: Format = None,
    compare: Compare = None,
    compare_base: CompareBase = None,
    rounds: Rounds = 1,
    round_: Round = None,
    reuse_worker: ReuseWorker = False,
) -> None:
    """Time forward, forward+backward or a full train step (a sweep over any list flags)."""
    from lmscope.measure.sampling import parse_target

    fixed = dict(d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                 vocab_size=vocab_size, model_context_length=model_context_length,
                 steps=steps, target_ci=parse_target(target_ci), max_time_s=max_time, device=device,
                 checkpoint=checkpoint)
    swept = model_grid({
        **model_axes(size=model_flag(model, size), context_length=context_length,
                     batch_size=batch_size, device=device,
                     mode=mode, precision=precision, compile=compile, attention=attention,
                     compile_scope=compile_scope),
        "warmup": split_list(warmup, int, "--warmup"),
        "fast": split_list(fast, bool, "--fast"),
        "optimizer_in_backward": split_list(optimizer_in_backward, bool, "--optimizer-in-backward"),
        "peer": split_list(peer, str, "--peer"),
        "cuda_graph": split_list(cuda_graph, str, "--cuda-graph"),
    }, fixed)
    from lmscope.workloads.step import Spec  # torch: only once the flags are known to be right

    specs = [Spec(**point) for point in expand_grid(fixed, swept)]
    records = run_and_report("bench", specs, out=out, resume=resume, timeout_s=timeout, fmt=fmt,
                             compare=compare, compare_base=compare_base, rounds=rounds, only_round=round_,
                             title="lmscope bench", reuse_worker=reuse_worker)
    raise typer.Exit(exit_status(records))


@app.command()
def profile(
    model: ModelOpt = None,
    size: Size = None,
    d_model: DModel = None,
    d_ff: DFf = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
    context_length: ContextLength = "128",
    batch_size: BatchSize = "4",
    mode: Mode = "train-step",
    precision: Precision = "fp32",
    compile: Compile = "off",
    compile_scope: CompileScope = "model",
    attention: Attention = "naive",
    fast: Fast = "off",
    optimizer_in_backward: OptimizerInBackward = "off",
    warmup: Annotated[int, typer.Option(help="untimed steps before measuring (outside the profiler)")] = 5,
    steps: Annotated[int, typer.Option(help="steps timed unprofiled, then as many profiled")] = 3,
    device: Device = "auto",
    nsys: Annotated[bool, typer.Option("--nsys", help="print (and, with nsys on PATH, run) nsys")] = False,
    out: Out = None,
    resume: Resume = False,
    timeout: Timeout = 900.0,
    fmt: Format = None,
    compare: Compare = None,
    compare_base: CompareBase = None,
    reuse_worker: ReuseWorker = False,
) -> None:
    """Kernel-level profile of a step: kernel tables, categories, idle gaps, attention breakdown."""
    from lmscope.cli.sweep import default_out

    out = out or default_out()
    fixed = dict(d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                 vocab_size=vocab_size, warmup=warmup, steps=steps, device=device,
                 artifacts_dir=str(out.parent / "profile"))
    swept = model_grid({**model_axes(size=model_flag(model, size), context_length=context_length,
                                     batch_size=batch_size, device=device, mode=mode, precision=precision,
                                     compile=compile, attention=attention, compile_scope=compile_scope),
                        "fast": split_list(fast, bool, "--fast"),
                        "optimizer_in_backward": split_list(optimizer_in_backward, bool,
                                                            "--optimizer-in-backward")}, fixed)
    from lmscope.report.profile_report import show_nsys, show_point_reports
    from lmscope.workloads.profile import Spec, nsys_capture

    specs = [Spec(**point) for point in expand_grid(fixed, swept)]
    records = run_and_report("profile", specs, out=out, resume=resume, timeout_s=timeout, fmt=fmt,
                             compare=compare, compare_base=compare_base, title="lmscope profile",
                             reuse_worker=reuse_worker)
    show_point_reports(records)
    for spec in specs if nsys else []:
        show_nsys(nsys_capture(spec, timeout_s=timeout))
    raise typer.Exit(exit_status(records))


@app.command()
def attention(
    preset: Annotated[str | None, typer.Option(help="leaderboard | classic | tflops; flags override")] = None,
    impl: Annotated[str | None, typer.Option(help="implementations, list ok, or all")] = None,
    batch: Annotated[str | None, typer.Option(help="batch size, list ok (default 8)")] = None,
    heads: Annotated[str | None, typer.Option(help="heads, list ok (default 1: no head dim)")] = None,
    head_dim: Annotated[str | None, typer.Option(help="d per head, list ok (default 64)")] = None,
    seq_len: Annotated[str | None, typer.Option(help="sequence length, list ok (default 1024)")] = None,
    dtype: Annotated[str | None, typer.Option(help="fp32 | bf16 | fp16, list ok (default fp32)")] = None,
    causal: Annotated[str | None, typer.Option(help="on | off | off,on (default on)")] = None,
    passes: Annotated[str | None, typer.Option(help="passes timed: fwd,bwd,fwd_bwd (default all)")] = None,
    warmup_ms: Annotated[float | None, typer.Option(help="do_bench warmup in ms (default 25)")] = None,
    rep_ms: Annotated[float | None, typer.Option(help="do_bench rep in ms (default 100)")] = None,
    cpu_steps: Annotated[int | None, typer.Option(help="timed calls per pass on CPU (default 3)")] = None,
    check_max_seq: Annotated[
        int | None, typer.Option(help="largest seq checked against float64 (default 4096; 0: never)")
    ] = None,
    device: Device = "auto",
    plot: Annotated[
        bool | None, typer.Option("--plot/--no-plot", help="latency plot (default: if >1 seq length)")
    ] = None,
    out: Out = None,
    resume: Resume = False,
    timeout: Timeout = 900.0,
    fmt: Format = None,
    compare: Compare = None,
    compare_base: CompareBase = None,
    rounds: Rounds = 1,
    round_: Round = None,
    reuse_worker: ReuseWorker = True,
) -> None:
    """Time attention implementations: latency, TFLOP/s, memory, error vs float64."""
    from lmscope.cli.sweep import default_out
    from lmscope.workloads.attention_grid import attention_grid

    lists = {"impl": (impl, str), "batch": (batch, int), "heads": (heads, int), "head_dim": (head_dim, int),
             "seq_len": (seq_len, int), "dtype": (dtype, str), "causal": (causal, bool)}
    overrides = {name: split_list(value, cast, "--" + name.replace("_", "-"))
                 for name, (value, cast) in lists.items() if value is not None}
    overrides.update(passes=passes, warmup_ms=warmup_ms, rep_ms=rep_ms, cpu_steps=cpu_steps,
                     check_max_seq=check_max_seq, device=device)
    grid = attention_grid(preset, overrides)  # checked before torch is imported
    from lmscope.report.attention_plots import plot_sweep
    from lmscope.workloads.attention import Spec

    specs = [Spec(**point) for point in expand_grid(*grid)]
    out = out or default_out()
    records = run_and_report("attention", specs, out=out, resume=resume, timeout_s=timeout, fmt=fmt,
                             compare=compare, compare_base=compare_base, rounds=rounds, only_round=round_,
                             title=f"lmscope attention {preset or ''}".strip(),
                             reuse_worker=reuse_worker)
    path = plot_sweep(records, out, specs[0].passes, [s.seq_len for s in specs], plot)
    if path:
        console.say(f"wrote {path}")
    raise typer.Exit(exit_status(records))


Nproc = Annotated[str | None, typer.Option(help="ranks, list ok (default 2; torchrun: WORLD_SIZE)")]
Backend = Annotated[str, typer.Option(help="auto (nccl with GPUs) | gloo | nccl")]
RankTimeout = Annotated[float, typer.Option(help="seconds a point's ranks may take")]


@app.command()
def comm(
    op: Annotated[str, typer.Option(help="all-reduce | all-gather | reduce-scatter | broadcast, list, all")]
    = "all-reduce",
    size: Annotated[str, typer.Option(help="buffer sizes S in decimal MB: 1MB,10MB,1GB (MiB, GiB ok)")]
    = "1MB,10MB,100MB,1GB",
    nproc: Nproc = None,
    backend: Backend = "auto",
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16 | float64")] = "float32",
    warmup: Annotated[int, typer.Option(help="untimed calls")] = 5,
    iters: Annotated[int, typer.Option(help="timed calls")] = 20,
    out: Out = None,
    resume: Resume = False,
    timeout: RankTimeout = 300.0,
    fmt: Format = None,
) -> None:
    """Time collectives like nccl-tests: time, algbw, busbw, #wrong; busbw-vs-size plot."""
    from lmscope.workloads.collective_choices import check_comm_dtype, collective_ops, parse_size_mb

    ops = collective_ops(split_list(op, str, "--op"))
    sizes = [parse_size_mb(s) for s in split_list(size, str, "--size")]
    check_comm_dtype(dtype)  # all checked before torch is imported
    from lmscope.cli.distributed_sweeps import run_comm
    from lmscope.parallel.launch import default_world_sizes
    from lmscope.workloads.collectives import Spec

    swept = {
        "op": ops,
        "world_size": split_list(nproc, int, "--nproc") if nproc is not None else default_world_sizes(),
        "size_mb": sizes,
    }
    fixed = dict(backend=backend, dtype=dtype, warmup=warmup, iters=iters, timeout_s=timeout)
    specs = [Spec(**point) for point in expand_grid(fixed, swept)]
    code = run_comm(specs, out=out, resume=resume, timeout_s=timeout, fmt=fmt)
    if code:
        raise typer.Exit(code)


@app.command()
def ddp(
    model: ModelOpt = None,
    size: Size = None,
    d_model: DModel = None,
    d_ff: DFf = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
    context_length: ContextLength = "128",
    batch_size: Annotated[str, typer.Option(help="sequences per batch PER RANK, list ok")] = "4",
    precision: Precision = "bf16",
    attention: Annotated[str, typer.Option(help="naive | sdpa | sdpa-cudnn | flash | flash-torch")] = "naive",
    strategy: Annotated[
        str, typer.Option(help="naive,flat,overlap,bucketed:<MiB>,coalesced:<MiB>,torch-ddp[:<MiB>],"
                          "fsdp[:separate-reduce],torch-fsdp2 (single is added as baseline)")
    ] = "naive,flat,overlap,bucketed:25,torch-ddp",
    shard_optimizer: Annotated[str, typer.Option(help="ShardedOptimizer: off | on | off,on")] = "off",
    optimizer_state: Annotated[str, typer.Option(help="where AdamW's moments live with --strategy fsdp: "
                                                 "device | host (pinned host memory, each unit updated "
                                                 "in the backward), list ok")] = "device",
    fast: Annotated[str, typer.Option("--fast", help="FastTransformerLM (fused kernels and loss; with "
                                      "fsdp, torch-fsdp2 and single): off | on")] = "off",
    checkpoint: Annotated[str, typer.Option(help="per-block treatment: none | block | every:K | blocks:LIST "
                                            "| selective[:LIST] | offload[:LIST], parts joined with +")]
    = "none",
    model_context_length: ModelContextLength = None,
    nproc: Nproc = None,
    backend: Backend = "auto",
    device: Annotated[str, typer.Option(help="auto | cuda | cpu (gloo)")] = "auto",
    warmup: Annotated[int, typer.Option(help="untimed steps")] = 5,
    steps: Annotated[int, typer.Option(help="timed steps")] = 10,
    rounds: Rounds = 1,
    profile_steps: Annotated[int, typer.Option(
        help="then profile this many steps per point (torch.profiler on every rank, traces in "
             "<--out folder>/ddp-profile): compute, exposed communication, idle, hooks' host time")] = 0,
    out: Out = None,
    resume: Resume = False,
    timeout: RankTimeout = 900.0,
    fmt: Format = None,
) -> None:
    """Data-parallel train step per strategy vs the single-GPU step, with the overhead model."""
    from lmscope.cli.sweep import default_out

    out = out or default_out()
    fixed = dict(d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                 vocab_size=vocab_size, attention=attention, backend=backend, device=device,
                 warmup=warmup, steps=steps, timeout_s=timeout, checkpoint=checkpoint,
                 fast=split_list(fast, bool, "--fast")[0], model_context_length=model_context_length,
                 profile_steps=profile_steps, artifacts_dir=str(out.parent / "ddp-profile"))
    strategies = split_list(strategy, str, "--strategy")
    axes = model_grid(model_axes(size=model_flag(model, size), context_length=context_length,
                                 batch_size=batch_size, device=device, precision=precision),
                      {**fixed, "strategy": strategies})
    from lmscope.cli.distributed_sweeps import run_ddp
    from lmscope.inputs.grid import ddp_points
    from lmscope.parallel.launch import default_world_sizes
    from lmscope.workloads.ddp import Spec

    swept = {
        **axes,
        "world_size": split_list(nproc, int, "--nproc") if nproc is not None else default_world_sizes(),
        "strategy": strategies,
        "shard_optimizer": split_list(shard_optimizer, bool, "--shard-optimizer"),
        "optimizer_state": split_list(optimizer_state, str, "--optimizer-state"),
    }
    specs = [Spec(**point) for point in ddp_points(fixed, swept)]
    code = run_ddp(specs, out=out, resume=resume, timeout_s=timeout, fmt=fmt, rounds=rounds)
    if code:
        raise typer.Exit(code)


@app.command()
def memory(
    model: ModelOpt = None,
    size: Size = None,
    d_model: DModel = None,
    d_ff: DFf = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
    context_length: ContextLength = "128",
    model_context_length: ModelContextLength = None,
    batch_size: BatchSize = "4",
    mode: Mode = "train-step",
    precision: Precision = "fp32",
    attention: Attention = "naive",
    checkpoint: Annotated[str, typer.Option(help="activation checkpointing: none | block | every:K | "
                                                 "blocks:0-3,7 | selective[:LIST] | offload[:LIST], "
                                                 "joined with + | plan:40GiB, list ok (';' between "
                                                 "policies with block lists)")] = "none",
    compile: Compile = "off",
    compile_scope: CompileScope = "model",
    warmup: Annotated[int, typer.Option(help="steps before measuring")] = 2,
    steps: Annotated[int, typer.Option(help="measured steps")] = 2,
    snapshot: Annotated[str, typer.Option(help="record a step's history: snapshot, timeline PNG, "
                                               "top allocations: on | off")] = "on",
    top: Annotated[int, typer.Option(help="largest allocation groups to show")] = 10,
    max_entries: Annotated[int, typer.Option(help="alloc/free events the snapshot keeps")] = 200_000,
    activations: Annotated[str, typer.Option(
        help="one more step: bytes saved for backward per block and op, gradients, the peak's "
             "breakdown: on | off")] = "off",
    device: Device = "auto",
    out: Out = None,
    resume: Resume = False,
    timeout: Timeout = 900.0,
    fmt: Format = None,
    compare: Compare = None,
    compare_base: CompareBase = None,
) -> None:
    """Peak memory of each phase (measured and predicted), snapshots, timelines, largest allocations."""
    from lmscope.accounting.treatments import checkpoint_values
    from lmscope.cli.sweep import default_out

    out = out or default_out()
    fixed = dict(d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                 vocab_size=vocab_size, model_context_length=model_context_length, warmup=warmup,
                 steps=steps, snapshot=split_list(snapshot, bool, "--snapshot")[0], top=top,
                 max_entries=max_entries, device=device, artifacts_dir=str(out.parent / "memory"),
                 activations=split_list(activations, bool, "--activations")[0])
    swept = model_grid({**model_axes(size=model_flag(model, size), context_length=context_length,
                                     batch_size=batch_size, device=device,
                                     mode=mode, precision=precision, compile=compile, attention=attention,
                                     compile_scope=compile_scope),
                        "checkpoint": checkpoint_values(checkpoint)}, fixed)
    from lmscope.report.memory_plots import show_saved_activations, show_top_allocations
    from lmscope.workloads.memory import Spec

    specs = [Spec(**point) for point in expand_grid(fixed, swept)]
    records = run_and_report("memory", specs, out=out, resume=resume, timeout_s=timeout, fmt=fmt,
                             compare=compare, compare_base=compare_base, title="lmscope memory")
    show_top_allocations(records)
    show_saved_activations(records)
    raise typer.Exit(exit_status(records))


@app.command()
def table(
    results: Annotated[Path, typer.Argument(help="a results.jsonl written by lmscope")],
    fmt: Format = None,
    compare: Compare = None,
    compare_base: CompareBase = None,
    workload: Annotated[str | None, typer.Option(help="which workload's rows (default: first)")] = None,
) -> None:
    """Re-render a results file without re-running anything."""
    from lmscope.cli.sweep import read_table_rows

    check_format(fmt)
    records = read_table_rows(results)
    chosen = workload if workload is not None else records[0].get("workload", "bench")
    rows = [r for r in records if r.get("workload") == chosen]
    if not rows:
        raise ValueError(f"{results} has no {chosen!r} rows")
    if compare_base is not None and compare is None:
        raise ValueError("--compare-base chooses the base of --compare: pass --compare FIELD too")
    show(rows, spec_fields(chosen), fmt=fmt, compare=compare, compare_base=compare_base, out=None,
         title=str(results))


@app.command()
def study(
    budget: Annotated[str, typer.Option(help="time for this run: 20m, 9m, 1h30m")] = "20m",
    out: Annotated[Path | None, typer.Option(help="run folder (default runs/study-<time>)")] = None,
    resume: Annotated[bool, typer.Option(help="finish what is missing in --out (default: newest)")] = False,
    device: Device = "auto",
    plan_only: Annotated[bool, typer.Option("--plan-only", help="print the plan, run nothing")] = False,
) -> None:
    """The whole study, section by section, scaled to this machine and --budget; resumable."""
    from lmscope.study.command import study as run_study

    code = run_study(budget=budget, out=out, resume=resume, device=device, plan_only=plan_only)
    if code:
        raise typer.Exit(code)


@app.command()
def report(
    results: Annotated[list[Path], typer.Argument(help="run folders or results.jsonl; two runs: compared")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="HTML file (default report.html "
                                                "in the first run folder); a .md twin beside it")] = None,
) -> None:
    """One self-contained HTML report (and a Markdown twin) of any lmscope results, or two compared."""
    from lmscope.report.page.command import write_report

    write_report(results, output)


app.add_typer(plan_app, name="plan")
app.add_typer(precision_app, name="precision")



def _is(error: BaseException, name: str) -> bool:
    """Whether `error` is a click-style exception called `name` (click, or typer's vendored copy)."""
    return any(cls.__name__ == name for cls in type(error).__mro__)


INTERRUPTED = "interrupted: finished points are saved; rerun with --resume to go on"


def _interrupted_message(argv: list[str] | None) -> str:
    """The interrupt line; only a command that has --resume suggests it."""
    words = list(sys.argv[1:] if argv is None else argv)
    resumable = {(c.name or c.callback.__name__) for c in app.registered_commands
                 if c.callback and "resume" in inspect.signature(c.callback).parameters}
    return INTERRUPTED if words and words[0] in resumable else "interrupted"


@contextmanager
def _termination_interrupts() -> Iterator[None]:
    """While a command runs, SIGTERM/SIGHUP (a cancelled job, a closed terminal) stop it like
    Ctrl-C, so its worker processes are killed and finished points stay saved."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    names = [name for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    previous = {name: signal.signal(getattr(signal, name), interrupt) for name in names}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app and turns user errors into one line and exit 2."""
    try:
        with _termination_interrupts():
            code = app(args=argv, standalone_mode=False, prog_name="lmscope")
    except (ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as error:
        console.fail(str(error))
        sys.exit(2)
    except KeyboardInterrupt:
        code = 130
    except Exception as error:
        if _is(error, "Exit"):
            sys.exit(error.exit_code)  # type: ignore[attr-defined]
        if _is(error, "Abort"):
            code = 130
        elif not _is(error, "UsageError"):
            raise
        else:
            ctx = getattr(error, "ctx", None)
            command = ctx.command_path if ctx is not None else "lmscope"
            message = error.format_message().replace("\n", " ")  # type: ignore[attr-defined]
            console.fail(f"{message} (see: {command} --help)")
            sys.exit(2)
    if code == 130:
        console.fail(_interrupted_message(argv))
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
