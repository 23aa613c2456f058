"""`lmscope plan` and `lmscope precision`: the command groups whose answers are tables computed
without a sweep (the accounting's predictions; what low precision does to sums and under autocast).

`app.py` adds both groups to the `lmscope` app.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from lmscope.cli.flags import split_list

plan_app = typer.Typer(help="Answers without a GPU run: FLOPs, memory, communication, parallelism.",
                       no_args_is_help=False, rich_markup_mode=None)
PlanModel = Annotated[str, typer.Option(help="preset (tiny..2.7B), or xxl (FFN-only) in comm/parallel")]
PlanInt = Annotated[int | None, typer.Option(help="override the model's value")]
PlanFormat = Annotated[str, typer.Option("--format", help="table | md | json")]
DeviceName = Annotated[str, typer.Option(help="H100 SXM | H100 PCIe | H200 | A100 | B200 | TPU v5p")]
PeakTflops = Annotated[float | None, typer.Option(help="peak TFLOP/s C (default: catalog, at --precision)")]
Bandwidth = Annotated[float | None, typer.Option(help="GB/s per device per mesh axis W (default: catalog)")]
ComputeDtype = Annotated[str, typer.Option(help="dtype of the peak C: bf16 | fp16 | fp32 | fp8")]


def _command_line() -> str:
    return " ".join(["lmscope", *sys.argv[1:]])


@plan_app.command("flops")
def plan_flops(
    model: PlanModel = "small", d_model: PlanInt = None, d_ff: PlanInt = None, num_layers: PlanInt = None,
    num_heads: PlanInt = None, vocab_size: PlanInt = None,
    batch_size: Annotated[int, typer.Option(help="sequences per batch")] = 4,
    context_length: Annotated[int, typer.Option(help="tokens per sequence")] = 128,
    mode: Annotated[str, typer.Option(help="forward | forward-backward | train-step")] = "train-step",
    contexts: Annotated[str, typer.Option(help="context lengths of the growth table")] = "128,512,2048,8192",
    step_ms: Annotated[float | None, typer.Option(help="a measured step time: gives TFLOP/s and MFU")] = None,
    device_name: Annotated[str | None, typer.Option(help="device for MFU's peak, e.g. 'H100 SXM'")] = None,
    precision: Annotated[str, typer.Option(help="dtype of MFU's peak: fp32 | tf32 | bf16 | fp16")] = "fp32",
    fmt: PlanFormat = "table",
) -> None:
    """Parameters by component, FLOPs per token and per step, attention share vs context, MFU."""
    from lmscope.planning import plan

    config = plan.transformer_config(model, d_model=d_model, d_ff=d_ff, num_layers=num_layers,
                                     num_heads=num_heads, vocab_size=vocab_size)
    sections = plan.flops_plan(model, config, batch_size=batch_size, seq_len=context_length, mode=mode,
                               contexts=split_list(contexts, int, "--contexts"), step_ms=step_ms,
                               device_name=device_name, precision=precision)
    plan.show(sections, fmt, title=f"lmscope plan flops: {model}", command=_command_line())


@plan_app.command("memory")
def plan_memory(
    model: PlanModel = "small", d_model: PlanInt = None, d_ff: PlanInt = None, num_layers: PlanInt = None,
    num_heads: PlanInt = None, vocab_size: PlanInt = None,
    batch_size: Annotated[int, typer.Option(help="sequences per batch")] = 4,
    context_length: Annotated[int, typer.Option(help="tokens per sequence")] = 128,
    mode: Annotated[str, typer.Option(help="forward | forward-backward | train-step")] = "train-step",
    precision: Annotated[str, typer.Option(help="fp32 | bf16 | fp16 (autocast)")] = "fp32",
    attention: Annotated[str, typer.Option(help="naive | sdpa | sdpa-cudnn | flash | flash-torch")] = "naive",
    checkpoint: Annotated[str, typer.Option(help="checkpointing: none | block | every:K")] = "none",
    fsdp: Annotated[int, typer.Option(help="FSDP degree: memory per rank and bytes per step of "
                                      "FullyShardedDP over this many ranks (1: off)")] = 1,
    fast: Annotated[str, typer.Option("--fast", help="FSDP units of the fast model: off | on")] = "off",
    fmt: PlanFormat = "table",
) -> None:
    """Predicted memory per phase of a step, its components, saved activations, one residual tensor."""
    from lmscope.planning import plan

    config = plan.transformer_config(model, d_model=d_model, d_ff=d_ff, num_layers=num_layers,
                                     num_heads=num_heads, vocab_size=vocab_size)
    sections = plan.memory_plan(model, config, batch_size=batch_size, seq_len=context_length, mode=mode,
                                precision=precision, attention=attention, checkpoint=checkpoint, fsdp=fsdp,
                                fast=split_list(fast, bool, "--fast")[0])
    plan.show(sections, fmt, title=f"lmscope plan memory: {model}", command=_command_line())


@plan_app.command("checkpoint")
def plan_checkpoint(
    model: Annotated[str | None, typer.Option(help="preset (default small; with --from: picks the row)")]
    = None,
    d_model: PlanInt = None, d_ff: PlanInt = None, num_layers: PlanInt = None,
    num_heads: PlanInt = None, vocab_size: PlanInt = None,
    budget: Annotated[str, typer.Option(help="memory per device, e.g. 40GiB, 80GB, 512MiB")] = "40GiB",
    margin: Annotated[float, typer.Option(help="percent of the budget left free for what the model "
                                               "leaves out (workspaces, rounding)")] = 5.0,
    batch_size: Annotated[int | None, typer.Option(help="sequences per batch (default 4)")] = None,
    context_length: Annotated[int | None, typer.Option(help="tokens per sequence (default 2048)")] = None,
    mode: Annotated[str | None, typer.Option(help="forward-backward | train-step")] = None,
    precision: Annotated[str | None, typer.Option(help="fp32 | bf16 | fp16 (autocast), default bf16")] = None,
    attention: Annotated[str | None,
                         typer.Option(help="naive | sdpa | sdpa-cudnn | flash | flash-torch")] = None,
    from_results: Annotated[Path | None, typer.Option(
        "--from", help="a results.jsonl with a `memory --activations on` row without checkpointing: "
                       "plan from its measured peak and bytes per block")] = None,
    fast: Annotated[str, typer.Option("--fast", help="plan lmscope's fast model (what its fused "
                                      "kernels save): off | on")] = "off",
    fsdp: Annotated[int, typer.Option(help="FSDP degree: memory per rank over this many ranks (1: off)")] = 1,
    optimizer_state: Annotated[str, typer.Option(
        help="where AdamW's moments live under --fsdp: device | host (pinned host memory, units updated "
             "in the backward)")] = "device",
    treatments: Annotated[str, typer.Option(help="what plans may use: full,selective,offload "
                                            "(plan:BUDGET policies use full only)")]
    = "full,selective,offload",
    device: Annotated[str, typer.Option(help="catalog device whose peaks price the treatments' time")]
    = "H100 SXM",
    host_link_gbps: Annotated[float | None, typer.Option(
        help="host-link bandwidth for offload, GB/s one way (default: the catalog's PCIe figure)")] = None,
    fmt: PlanFormat = "table",
) -> None:
    """Which blocks to checkpoint, recompute selectively or offload under a memory budget: candidates,
    predicted peak, recompute share and the time the treatments add."""
    from lmscope.accounting.checkpoint_plan import parse_bytes
    from lmscope.planning import plan
    from lmscope.planning.plan_checkpoint import checkpoint_sections, measured_from

    measured = None
    point = dict(batch_size=batch_size, context_length=context_length, mode=mode, precision=precision,
                 attention=attention)
    if from_results is not None:
        model, config, point, measured = measured_from(from_results, size=model, **point)
    else:
        model = "small" if model is None else model
        config = plan.transformer_config(model, d_model=d_model, d_ff=d_ff, num_layers=num_layers,
                                         num_heads=num_heads, vocab_size=vocab_size)
        defaults = dict(batch_size=4, context_length=2048, mode="train-step", precision="bf16",
                        attention="sdpa")
        point = {k: defaults[k] if v is None else v for k, v in point.items()}
    sections = checkpoint_sections(model, config, batch_size=point["batch_size"],
                                   seq_len=point["context_length"], budget=parse_bytes(budget),
                                   mode=point["mode"], precision=point["precision"],
                                   attention=point["attention"], measured=measured, margin_pct=margin,
                                   fast=split_list(fast, bool, "--fast")[0], world_size=fsdp,
                                   treatments=tuple(split_list(treatments, str, "--treatments")),
                                   device=device, host_link_gbps=host_link_gbps,
                                   optimizer_state=optimizer_state)
    plan.show(sections, fmt, title=f"lmscope plan checkpoint: {model}", command=_command_line())


@plan_app.command("presets")
def plan_presets(fmt: PlanFormat = "table") -> None:
    """Every model preset with its shape and parameter count."""
    from lmscope.planning import plan
    from lmscope.planning.plan_checkpoint import presets_sections

    plan.show(presets_sections(), fmt, title="lmscope plan presets", command=_command_line())


@plan_app.command("comm")
def plan_comm(
    model: PlanModel = "small", d_model: PlanInt = None, d_ff: PlanInt = None, num_layers: PlanInt = None,
    num_heads: PlanInt = None, vocab_size: PlanInt = None,
    batch_size: Annotated[int, typer.Option(help="sequences per global batch")] = 8,
    context_length: Annotated[int, typer.Option(help="tokens per sequence")] = 1024,
    devices: Annotated[int, typer.Option(help="devices each strategy spreads over")] = 8,
    comm_dtype: Annotated[str, typer.Option(help="dtype on the wire: fp32 | bf16 | fp16")] = "fp32",
    device_name: DeviceName = "H100 SXM", precision: ComputeDtype = "bf16",
    peak_tflops: PeakTflops = None, bandwidth_gbps: Bandwidth = None, fmt: PlanFormat = "table",
) -> None:
    """Bytes moved per step and their time for data parallel, FSDP and tensor parallel."""
    from lmscope.accounting.parallelism import hardware
    from lmscope.planning import plan

    shape = plan.model_shape(model, context_length, d_model=d_model, d_ff=d_ff, num_layers=num_layers,
                             num_heads=num_heads, vocab_size=vocab_size)
    hw = hardware(device_name, precision, peak_tflops=peak_tflops, bandwidth_gbps=bandwidth_gbps)
    sections = plan.comm_plan(shape, devices=devices, tokens=batch_size * context_length, hw=hw,
                              comm_dtype=comm_dtype)
    plan.show(sections, fmt, title=f"lmscope plan comm: {model} on {devices} x {hw.name}",
              command=_command_line())


@plan_app.command("parallel")
def plan_parallel(
    model: PlanModel = "small", d_model: PlanInt = None, d_ff: PlanInt = None, num_layers: PlanInt = None,
    num_heads: PlanInt = None, vocab_size: PlanInt = None,
    batch_size: Annotated[int, typer.Option(help="sequences per global batch")] = 8,
    context_length: Annotated[int, typer.Option(help="tokens per sequence")] = 1024,
    dp: Annotated[int, typer.Option(help="data-parallel replicas")] = 1,
    fsdp: Annotated[int, typer.Option(help="FSDP shards X")] = 1,
    tp: Annotated[int, typer.Option(help="tensor-parallel shards Y")] = 1,
    pp: Annotated[int, typer.Option(help="pipeline stages")] = 1,
    dp_axes: Annotated[int, typer.Option(help="mesh axes DP spans")] = 1,
    fsdp_axes: Annotated[int, typer.Option(help="mesh axes FSDP spans (M_X)")] = 1,
    tp_axes: Annotated[int, typer.Option(help="mesh axes TP spans (M_Y)")] = 1,
    master: Annotated[str, typer.Option(help="master weights dtype")] = "fp32",
    gradients: Annotated[str, typer.Option(help="accumulated gradients dtype")] = "fp32",
    optimizer: Annotated[str, typer.Option(help="AdamW state dtype")] = "fp32",
    activations: Annotated[str, typer.Option(help="saved activations dtype")] = "bf16",
    comm_dtype: Annotated[str, typer.Option(help="dtype on the wire")] = "bf16",
    attention: Annotated[str, typer.Option(help="attention backend (sets saved activations)")] = "naive",
    device_name: DeviceName = "H100 SXM", precision: ComputeDtype = "bf16",
    peak_tflops: PeakTflops = None, bandwidth_gbps: Bandwidth = None,
    worked_example: Annotated[bool, typer.Option(help="the XXL walk-through with its formulas")] = False,
    fmt: PlanFormat = "table",
) -> None:
    """Per-device memory, traffic per axis and compute-bound batch of a DP x FSDP x TP x PP mesh."""
    from lmscope.accounting.parallelism import Mesh, PrecisionPlan, hardware
    from lmscope.planning import plan

    if worked_example:
        sections = plan.worked_example_plan(plan.ffn_stack(model, d_model=d_model, d_ff=d_ff,
                                                           num_layers=num_layers))
        plan.show(sections, fmt, title=f"Worked example: the {model} FFN-only model",
                  command=_command_line())
        return
    shape = plan.model_shape(model, context_length, activations=activations, attention=attention,
                             d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                             vocab_size=vocab_size)
    mesh = Mesh(dp=dp, fsdp=fsdp, tp=tp, pp=pp, dp_axes=dp_axes, fsdp_axes=fsdp_axes, tp_axes=tp_axes)
    dtypes = PrecisionPlan(master=master, gradients=gradients, optimizer=optimizer,
                           activations=activations, communication=comm_dtype)
    hw = hardware(device_name, precision, peak_tflops=peak_tflops, bandwidth_gbps=bandwidth_gbps)
    sections = plan.parallel_plan(shape, mesh, dtypes, tokens=batch_size * context_length, hw=hw)
    plan.show(sections, fmt, title=f"lmscope plan parallel: {model} on {mesh.devices} x {hw.name}",
              command=_command_line())


precision_app = typer.Typer(help="What low precision does to sums and to a model under autocast.",
                            no_args_is_help=False, rich_markup_mode=None)


@precision_app.command("accumulate")
def precision_accumulate(
    count: Annotated[str, typer.Option(help="additions, list ok")] = "1000",
    value: Annotated[float, typer.Option(help="the value added each time")] = 0.01,
    device: Annotated[str, typer.Option(help="cpu | cuda")] = "cpu",
    fmt: PlanFormat = "table",
) -> None:
    """Sum a small value many times with fp32, fp16, bf16 and mixed accumulators; errors vs exact."""
    from lmscope.planning.plan import check_format, show
    from lmscope.planning.precision import accumulate

    check_format(fmt)
    rows = [r for n in split_list(count, int, "--count") for r in accumulate(n, value, device)]
    show({"accumulation": rows}, fmt, title="lmscope precision accumulate", command=_command_line(),
         full_digits=True)


@precision_app.command("autocast")
def precision_autocast(
    model: Annotated[str, typer.Option(help="toy (fc1-relu-ln-fc2) or a preset, list ok")] = "toy,tiny",
    dtype: Annotated[str, typer.Option(help="autocast dtype: fp16 | bf16, list ok")] = "fp16,bf16",
    device: Annotated[str, typer.Option(help="auto | cpu | cuda")] = "auto",
    fmt: PlanFormat = "table",
) -> None:
    """Dtypes of parameters, each submodule's output, the loss and the gradients under autocast."""
    from lmscope.planning.plan import check_format, show
    from lmscope.planning.precision import autocast_dtypes
    from lmscope.workloads.train_step import resolve_device

    check_format(fmt)
    target = str(resolve_device(device))
    sections = {f"{m} under {d} autocast on {target}": autocast_dtypes(m, d, target)
                for m in split_list(model, str, "--model") for d in split_list(dtype, str, "--dtype")}
    show(sections, fmt, title="lmscope precision autocast", command=_command_line())
