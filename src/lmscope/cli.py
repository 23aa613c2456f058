"""The `lmscope` command line: one thin function per command (flags -> specs -> runner).

A user's mistake (unknown flag, bad value, impossible size) ends in one line on stderr and
exit code 2, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from lmscope.commands import run_and_report, show, split_list
from lmscope.report import console
from lmscope.results import read_records
from lmscope.runner import expand_grid, spec_fields

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


def _default_size() -> str:
    import torch

    return "small" if torch.cuda.is_available() else "tiny"


@app.command()
def bench(
    size: Annotated[str | None, typer.Option(help="preset(s): tiny,small,medium,large,xl,2.7B")] = None,
    d_model: Annotated[int | None, typer.Option(help="override d_model")] = None,
    d_ff: Annotated[int | None, typer.Option(help="override d_ff")] = None,
    num_layers: Annotated[int | None, typer.Option(help="override num_layers")] = None,
    num_heads: Annotated[int | None, typer.Option(help="override num_heads")] = None,
    vocab_size: Annotated[int | None, typer.Option(help="override vocab_size")] = None,
    context_length: Annotated[str, typer.Option(help="tokens per sequence, list ok")] = "128",
    model_context_length: Annotated[
        int | None, typer.Option(help="the model's context_length (default: --context-length)")
    ] = None,
    batch_size: Annotated[str, typer.Option(help="sequences per batch, list ok")] = "4",
    mode: Annotated[str, typer.Option(help="forward | forward-backward | train-step")] = "train-step",
    precision: Annotated[str, typer.Option(help="fp32 | bf16 | fp16, list ok")] = "fp32",
    compile: Annotated[str, typer.Option("--compile", help="torch.compile: off | on | off,on")] = "off",
    attention: Annotated[str, typer.Option(help="naive | sdpa | flash | flash-torch, list ok")] = "naive",
    warmup: Annotated[str, typer.Option(help="untimed steps before measuring, list ok")] = "5",
    steps: Annotated[int, typer.Option(help="timed steps")] = 10,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    out: Out = None,
    resume: Resume = False,
    timeout: Timeout = 900.0,
    fmt: Format = None,
    compare: Compare = None,
) -> None:
    """Time forward, forward+backward or a full train step (a sweep over any list flags)."""
    from lmscope.workloads.step import Spec

    fixed = dict(d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                 vocab_size=vocab_size, model_context_length=model_context_length,
                 steps=steps, device=device)
    swept = {
        "size": split_list(size or _default_size(), str, "--size"),
        "context_length": split_list(context_length, int, "--context-length"),
        "batch_size": split_list(batch_size, int, "--batch-size"),
        "mode": split_list(mode, str, "--mode"),
        "precision": split_list(precision, str, "--precision"),
        "compile": split_list(compile, bool, "--compile"),
        "attention": split_list(attention, str, "--attention"),
        "warmup": split_list(warmup, int, "--warmup"),
    }
    specs = [Spec(**point) for point in expand_grid(fixed, swept)]
    run_and_report("bench", specs, out=out, resume=resume, timeout_s=timeout, fmt=fmt,
                   compare=compare, title="lmscope bench")


@app.command()
def table(
    results: Annotated[Path, typer.Argument(help="a results.jsonl written by lmscope")],
    fmt: Format = None,
    compare: Compare = None,
    workload: Annotated[str | None, typer.Option(help="which workload's rows (default: first)")] = None,
) -> None:
    """Re-render a results file without re-running anything."""
    records = read_records(results)
    if not records:
        raise ValueError(f"{results} holds no records")
    chosen = workload or records[0].get("workload", "bench")
    rows = [r for r in records if r.get("workload") == chosen]
    if not rows:
        raise ValueError(f"{results} has no {chosen!r} rows")
    show(rows, spec_fields(chosen), fmt=fmt, compare=compare, out=None, title=str(results))


def _is(error: BaseException, name: str) -> bool:
    """Whether `error` is a click-style exception called `name` (click, or typer's vendored copy)."""
    return any(cls.__name__ == name for cls in type(error).__mro__)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the app and turns user errors into one line and exit 2."""
    try:
        app(args=argv, standalone_mode=False, prog_name="lmscope")
    except (ValueError, FileNotFoundError) as error:
        console.fail(str(error))
        sys.exit(2)
    except KeyboardInterrupt:
        console.fail("interrupted: finished points are saved; rerun with --resume to go on")
        sys.exit(130)
    except Exception as error:
        if _is(error, "Exit"):
            sys.exit(error.exit_code)  # type: ignore[attr-defined]
        if _is(error, "Abort"):
            console.fail("interrupted: finished points are saved; rerun with --resume to go on")
            sys.exit(130)
        if not _is(error, "UsageError"):
            raise
        ctx = getattr(error, "ctx", None)
        command = ctx.command_path if ctx is not None else "lmscope"
        message = error.format_message().replace("\n", " ")  # type: ignore[attr-defined]
        console.fail(f"{message} (see: {command} --help)")
        sys.exit(2)


if __name__ == "__main__":
    main()
