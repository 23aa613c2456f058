"""Regenerate (``--write``) or check (``--check``) every generated number in the docs.

The docs are README.md, docs/**/*.md, benchmarks/results/**/README.md and every
benchmarks/results/**/summary.md. Each block between ``<!-- claims: NAME -->`` and
``<!-- /claims -->`` is the output of the claim NAME below, a query over the committed JSONL rows
under benchmarks/results/; each summary.md is the output of the script that writes it
(`SUMMARY_SCRIPTS`) over the rows beside it. ``--check`` exits 1 naming file and line when a block
or a summary is stale, a claim finds no row, a ratio mixes two commits, a relative link resolves to
nothing, or a number with a unit sits outside a block where the rows its text refers to do not
back it (`lmscope.report.claims` says what backs a number). Usage, from the repository root:

    uv run python benchmarks/claims.py --check
    uv run python benchmarks/claims.py --write
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import importlib.util
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from lmscope.parallel.strategies import BASELINE, parse_strategy
from lmscope.records.provenance import code_identity
from lmscope.records.stats import ratio_interval
from lmscope.report.claims import (
    ClaimError,
    Registry,
    Rows,
    Scope,
    check_files,
    claim_block,
    fmt,
    provenance,
    ratio,
    table,
)

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = Registry(ROOT)
claim = REGISTRY.claim

FAST = "benchmarks/results/fast"
ATTENTION = "benchmarks/results/attention"
LEADERBOARD = dict(batch=1, heads=16, seq_len=16384, head_dim=64, dtype="bf16", causal=True)
"""The reference attention workload (`lmscope attention --preset leaderboard`)."""


def doc_files(root: Path = ROOT) -> list[Path]:
    """Every doc whose numbers must come from rows."""
    docs = [*root.glob("docs/**/*.md"), *root.glob("benchmarks/results/**/README.md"),
            *root.glob("benchmarks/results/**/summary.md")]
    return sorted([root / "README.md", *docs])


SUMMARY_SCRIPTS = (
    ("memory/activations*", "benchmarks/memory/summarize_activations.py", "results.jsonl"),
    ("memory", "benchmarks/memory/summarize.py", "results.jsonl"),
    ("attention", "benchmarks/attention/summarize.py", "."),
    ("fast", "benchmarks/fast/summarize.py", "."),
    ("own_model", "benchmarks/own_model/summarize.py", "."),
)
"""(folder under benchmarks/results, first match wins; the script that writes the summary.md of a
run there; what its `summary_text` reads, relative to the run's folder)."""


@functools.cache
def _script(relative: str) -> ModuleType:
    """A summarize script as a module of its own name (the scripts share the name `summarize`)."""
    name = "summary_" + relative.removeprefix("benchmarks/").removesuffix(".py").replace("/", "_")
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary_script(path: Path, root: Path = ROOT) -> tuple[str, Path] | None:
    """(script, what it reads) of a summary.md under benchmarks/results; None for another doc."""
    results = root / "benchmarks" / "results"
    if path.name != "summary.md" or results not in path.parents:
        return None
    folder = path.parent.relative_to(results).as_posix()
    for pattern, script, reads in SUMMARY_SCRIPTS:
        if fnmatch.fnmatch(folder, pattern) or fnmatch.fnmatch(folder, pattern + "/*"):
            return script, (path.parent / reads).resolve()
    return None


def scope(path: Path, root: Path = ROOT) -> Scope:
    """A summary.md is its script's output over the rows beside it; a results README is checked
    per section, against the rows beside it too; another doc per paragraph."""
    written = summary_script(path, root)
    if written is not None:
        script, reads = written
        return Scope(regenerate=lambda: _script(script).summary_text(reads))
    beside = "benchmarks/results/" in path.as_posix()
    return Scope(by_section=beside, rows_beside=beside)


def runs_of(found: list[dict]) -> list[list[dict]]:
    """`found` split into runs: one results file at one code identity, rows in time order."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for row in sorted(found, key=lambda r: r["time"]):
        runs.setdefault((row["_file"], code_identity(row)), []).append(row)
    return list(runs.values())


@claim("attention-headline")
def attention_headline(rows: Rows) -> str:
    """The reference workload, from the newest run that measured flash-triton with both SDPA peers."""
    candidates = [r for r in rows.select(f"{ATTENTION}/*/*.jsonl", **LEADERBOARD)
                  if "fwd_bwd_ms" in r and "fwd_ms" in r]
    needed = {"flash-triton", "sdpa-flash", "sdpa-cudnn"}
    runs = [r for r in runs_of(candidates) if needed <= {x["impl"] for x in r}]
    if not runs:
        raise ClaimError("no run measured flash-triton, sdpa-flash and sdpa-cudnn at the leaderboard shape")
    run = max(runs, key=lambda r: r[-1]["time"])
    latest = {r["impl"]: r for r in run}
    ours = latest["flash-triton"]
    body = []
    for impl in ("flash-triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "naive"):
        if impl in latest:
            r = latest[impl]
            speed = ("" if impl == "flash-triton"
                     else ratio(r, ours, key="fwd_bwd_ms", times="fwd_bwd_times_ms"))
            body.append([impl, fmt(r["fwd_ms"]), fmt(r["bwd_ms"]), fmt(r["fwd_bwd_ms"]),
                         fmt(r["fwd_bwd_p20_ms"]), fmt(r["fwd_bwd_p80_ms"]), speed])
    return claim_block(
        "Batch 1, 16 heads, 16384 tokens, head dim 64, bf16, causal; `do_bench` medians in ms; "
        "speed = peer fwd+bwd / flash-triton fwd+bwd (above 1: flash-triton faster), with the 95 % "
        "bootstrap interval of the per-call times where the rows keep them.",
        table(["impl", "fwd ms", "bwd ms", "fwd+bwd ms", "p20", "p80", "speed"], body),
        f"Measured on {provenance(list(latest.values()))}.",
    )


def newest_run(found: list[dict], newest: dict) -> list[dict]:
    """The rows of `found` from the same script run as `newest`: the scripts stamp every row of a
    run with one provenance, so its `time` (and the shape) picks the run out (two runs of one
    source share a code identity)."""
    keys = ("time", "shape")
    return [r for r in found if code_identity(r) == code_identity(newest)
            and all(r.get(k) == newest.get(k) for k in keys)]


@claim("attention-host-breakdown")
def attention_host_breakdown(rows: Rows) -> str:
    """Host microseconds per eager call at xl's attention layer, by part, from the newest run."""
    found = rows.select(f"{ATTENTION}/*/host.jsonl", status=None)  # its rows carry no status
    newest = max(found, key=lambda r: r["time"])
    run = newest_run(found, newest)
    sdpa = next(r["host_us"] for r in run if r["part"] == "sdpa: forward+backward through autograd")
    body = [[r["part"], fmt(r["host_us"]), ratio_text(r["host_us"], sdpa)] for r in run]
    return claim_block(
        f"Shape (B, H, S, d) = {tuple(newest['shape'])}, bf16, causal; host microseconds per call "
        "(median of rounds of unsynchronized calls, `e124d15:benchmarks/attention/host_timing.py`); "
        "x SDPA = the part over SDPA's whole forward+backward in the same run.",
        table(["part", "host us/call", "x SDPA fwd+bwd"], body),
        f"Measured on {provenance(run)}.",
    )


ISSUE19_SHAPES = ((1, 16, 16384, 64), (1, 16, 8192, 128), (1, 16, 32768, 128), (8, 16, 1024, 64),
                  (4, 25, 512, 64), (4, 32, 512, 80))
"""Issue 19's shapes (B, H, S, d): long context, then the models' own layers (xl, 2.7B)."""


@claim("attention-issue19-shapes")
def attention_issue19_shapes(rows: Rows) -> str:
    """Ours against SDPA's flash and cuDNN backends at issue 19's shapes, from the newest run
    that measured all of them (fwd+bwd, bf16, causal)."""
    found = rows.select(f"{ATTENTION}/*/attention_shapes.jsonl", dtype="bf16", causal=True)
    def point(run: list[dict], shape: tuple[int, ...], impl: str) -> dict | None:
        """The newest row of `impl` at `shape` in `run` (its rows are in time order)."""
        matches = [r for r in run if r["impl"] == impl and
                   (r["batch"], r["heads"], r["seq_len"], r["head_dim"]) == shape]
        return matches[-1] if matches else None

    impls = ("flash-triton", "sdpa-flash", "sdpa-cudnn")
    complete = [run for run in runs_of(found)
                if all(point(run, s, i) for s in ISSUE19_SHAPES for i in impls)]
    if not complete:
        raise ClaimError("no run measured every issue 19 shape with flash-triton, sdpa-flash and sdpa-cudnn")
    run = max(complete, key=lambda r: max(x["time"] for x in r))
    body = []
    for shape in ISSUE19_SHAPES:
        ours, flash, cudnn = (point(run, shape, i) for i in impls)
        best = min((flash, cudnn), key=lambda r: r["fwd_bwd_ms"])
        body.append([", ".join(map(str, shape)), fmt(ours["fwd_bwd_ms"]), fmt(flash["fwd_bwd_ms"]),
                     fmt(cudnn["fwd_bwd_ms"]), best["impl"],
                     ratio(ours, best, key="fwd_bwd_ms", times="fwd_bwd_times_ms")])
    used = [point(run, shape, i) for shape in ISSUE19_SHAPES for i in impls]
    return claim_block(
        "fwd+bwd, bf16, causal; `do_bench` medians in ms, every implementation in the same run; "
        "ours / fastest = flash-triton over the faster SDPA backend (above 1: ours slower), with "
        "the 95 % bootstrap interval of the per-call times. Target: at most 1.1x at every shape.",
        table(["B, H, S, d", "ours ms", "SDPA flash ms", "SDPA cuDNN ms", "fastest SDPA", "ours / fastest"],
              body),
        f"Measured on {provenance(used)}.",
    )


ROUND_27 = f"{ATTENTION}/27-round-h200"
ROUND_28 = f"{ATTENTION}/28-round-h100"
DQ_SHAPES = ((1, 16, 16384, 64), (1, 16, 8192, 128), (8, 16, 1024, 64), (1, 16, 32768, 128))
"""The shapes of e124d15:benchmarks/h100_round.sh's dq-modes stage (B, H, S, d)."""


def _at(shape: tuple[int, ...]) -> dict:
    """The row filter of a (B, H, S, d) shape, bf16, causal."""
    batch, heads, seq_len, head_dim = shape
    return dict(batch=batch, heads=heads, seq_len=seq_len, head_dim=head_dim, dtype="bf16", causal=True)


def _ours_and_fastest(rows: Rows, path: str, shape: tuple[int, ...]) -> tuple[dict, dict, list[dict]]:
    """(our row, the faster SDPA backend's row by fwd+bwd, all three rows) of ``path`` at ``shape``."""
    found = {i: rows.one(path, impl=i, **_at(shape)) for i in ("flash-triton", "sdpa-flash", "sdpa-cudnn")}
    best = min(found["sdpa-flash"], found["sdpa-cudnn"], key=lambda r: r["fwd_bwd_ms"])
    return found["flash-triton"], best, list(found.values())


@claim("attention-dq-tma")
def attention_dq_tma(rows: Rows) -> str:
    """Ours with dQ from its own kernel (separate) and as TMA reduce-adds from the dK/dV kernel
    (tma), cuDNN beside each in its run (two calls on one machine, two commits: no ratio across)."""
    body, runs = [], {"separate": [], "tma": []}
    for shape in DQ_SHAPES:
        line = [", ".join(map(str, shape))]
        for mode in runs:
            ours = rows.one(f"{ROUND_27}/dq_{mode}.jsonl", impl="flash-triton", **_at(shape))
            cudnn = rows.one(f"{ROUND_27}/dq_{mode}.jsonl", impl="sdpa-cudnn", **_at(shape))
            runs[mode] += [ours, cudnn]
            line += [fmt(ours["bwd_ms"]), fmt(ours["fwd_bwd_ms"]),
                     ratio(ours, cudnn, key="fwd_bwd_ms", times="fwd_bwd_times_ms")]
        body.append(line)
    return claim_block(
        "bf16, causal; `do_bench` medians in ms; ours / cuDNN = fwd+bwd over cuDNN's in the same "
        "run, with the 95 % bootstrap interval of the per-call times.",
        table(["B, H, S, d", "separate bwd", "separate fwd+bwd", "separate / cuDNN",
               "tma bwd", "tma fwd+bwd", "tma / cuDNN"], body),
        f"separate: {provenance(runs['separate'])}.",
        f"tma: {provenance(runs['tma'])}.",
    )


def _variant_against_default(rows: Rows, folder: str, files: tuple[str, str], shapes: tuple,
                             names: tuple[str, str], key: str) -> str:
    """Ours in two passes of one call, the default and a variant (``files``), at ``shapes``:
    ``key`` of each and variant / default, then each pass's fwd+bwd over cuDNN's beside it."""
    body, used = [], []
    for shape in shapes:
        base, variant = (rows.one(f"{folder}/{f}.jsonl", impl="flash-triton", **_at(shape)) for f in files)
        cudnn = [rows.one(f"{folder}/{f}.jsonl", impl="sdpa-cudnn", **_at(shape)) for f in files]
        used += [base, variant, *cudnn]
        times = key.replace("_ms", "_times_ms")
        body.append([", ".join(map(str, shape)), fmt(base[key]), fmt(variant[key]),
                     ratio(variant, base, key=key, times=times),
                     *(ratio(ours, peer, key="fwd_bwd_ms", times="fwd_bwd_times_ms")
                       for ours, peer in zip((base, variant), cudnn, strict=True))])
    default, other = names
    what = key.removesuffix("_ms").replace("fwd_bwd", "fwd+bwd")
    return claim_block(
        "bf16, causal; `do_bench` medians in ms; ratios with the 95 % bootstrap interval of the "
        "per-call times; cuDNN measured beside each pass.",
        table(["B, H, S, d", f"{what}, {default}", f"{what}, {other}", f"{other} / {default} ({what})",
               f"fwd+bwd / cuDNN, {default}", f"fwd+bwd / cuDNN, {other}"], body),
        f"Measured on {provenance(used)}.",
    )


@claim("attention-wide-d128")
def attention_wide_d128(rows: Rows) -> str:
    """Ours with the default config lists against LMSCOPE_FLASH_WIDE=1's at d 128 (one call:
    wide_d128_default.jsonl, then wide_d128.jsonl)."""
    return _variant_against_default(rows, f"{ATTENTION}/26-round-h100", ("wide_d128_default", "wide_d128"),
                                    ((1, 16, 8192, 128), (1, 16, 32768, 128)), ("default", "wide"),
                                    "fwd_bwd_ms")  # fmt: skip


@claim("attention-tma-loads")
def attention_tma_loads(rows: Rows) -> str:
    """The backward with its per-step tiles through TMA against the pointer loads, one H100 call."""
    return _variant_against_default(rows, f"{ATTENTION}/27-round-h100", ("tma_loads", "tma_loads_on"),
                                    ((1, 16, 16384, 64), (1, 16, 8192, 128), (1, 16, 32768, 128)),
                                    ("pointer loads", "TMA loads"), "bwd_ms")  # fmt: skip


@claim("attention-tma-forward")
def attention_tma_forward(rows: Rows) -> str:
    """The forward with TMA tiles against the pointer-load forward, one H100 call (variant 7)."""
    return _variant_against_default(rows, f"{ATTENTION}/29-round-h100", ("tma_fwd_0", "tma_fwd_1"),
                                    ((1, 16, 8192, 128), (1, 16, 32768, 128), (1, 16, 16384, 64)),
                                    ("pointer loads", "TMA tiles"), "fwd_ms")  # fmt: skip


SM90_SHAPES = ((1, 16, 16384, 64), (1, 16, 8192, 128), (1, 16, 32768, 128))
"""Issue 19's long-context shapes, where the Gluon sm_90 kernels serve (flash_sm90.MIN_WORK)."""


def _sm90_against_triton(rows: Rows, key: str) -> str:
    """``key`` of ours with the Triton kernels (LMSCOPE_FLASH_SM90=0) and with the Gluon sm_90
    kernels, one H100 call, cuDNN beside each pass (variant 8 of the backward notes)."""
    return _variant_against_default(rows, f"{ATTENTION}/30-round-h100", ("sm90_off", "sm90_on"), SM90_SHAPES,
                                    ("Triton kernels", "Gluon kernels"), key)  # fmt: skip


@claim("attention-sm90-fwd-bwd")
def attention_sm90_fwd_bwd(rows: Rows) -> str:
    """Forward+backward, Gluon sm_90 kernels against the Triton ones."""
    return _sm90_against_triton(rows, "fwd_bwd_ms")


@claim("attention-sm90-fwd")
def attention_sm90_fwd(rows: Rows) -> str:
    """Forward alone, Gluon sm_90 kernel against the Triton one."""
    return _sm90_against_triton(rows, "fwd_ms")


@claim("attention-sm90-bwd")
def attention_sm90_bwd(rows: Rows) -> str:
    """Backward alone (dQ and dK/dV kernels), Gluon sm_90 kernels against the Triton ones."""
    return _sm90_against_triton(rows, "bwd_ms")


ROUND_31 = f"{ATTENTION}/31-round-h100"


@claim("attention-dq-elementwise")
def attention_dq_elementwise(rows: Rows) -> str:
    """The first five-matmul backward (per-element fp32 atomics from the Gluon dK/dV kernel)
    against the separate dQ kernel, one H100 call at f607aff (variant 9, step 1)."""
    files = ("dq_elementwise_separate", "dq_elementwise_atomic")
    names = ("separate dQ", "per-element atomics")
    return _variant_against_default(rows, ROUND_31, files, SM90_SHAPES, names, "bwd_ms")


def _dq_modes(rows: Rows, folder: str, shapes: tuple, key: str) -> str:
    """``key`` of ours with the separate dQ kernel (LMSCOPE_FLASH_DQ=separate) and in the default
    auto mode (the five-matmul Gluon dK/dV kernel), one H100 call of
    ``e124d15:benchmarks/h100_round.sh``'s dq-modes
    stage in ``folder``, at ``shapes``."""
    return _variant_against_default(rows, folder, ("dq_separate", "dq_auto"), shapes,
                                    ("separate dQ", "five matmuls"), key)  # fmt: skip


DQ_AUTO_D64 = ((1, 16, 16384, 64),)
"""Variant 9's call: auto took the five-matmul backward at head dim 64 only."""


@claim("attention-dq-auto-fwd-bwd")
def attention_dq_auto_fwd_bwd(rows: Rows) -> str:
    """Forward+backward, the five-matmul backward against the separate dQ kernel (variant 9)."""
    return _dq_modes(rows, ROUND_31, DQ_AUTO_D64, "fwd_bwd_ms")


@claim("attention-dq-auto-bwd")
def attention_dq_auto_bwd(rows: Rows) -> str:
    """Backward alone, the five-matmul backward against the separate dQ kernel (variant 9)."""
    return _dq_modes(rows, ROUND_31, DQ_AUTO_D64, "bwd_ms")


# (development call's file, its commit): e124d15:benchmarks/attention/sm90_kernels.py --variants
SM90_STEPS = (
    ("sm90_v10_variants", "7461028"),
    ("sm90_v11_variants", "90b9ed2"),
    ("sm90_v13_variants", "67ab2d5"),
    ("sm90_v14_variants", "0e340fa"),
    ("sm90_v15_variants", "d6a6896"),
)
"""Variant 9's development calls, in order; each call times its variants and its default in one
process. (v12, a1a9f65, failed its correctness check and timed nothing of the new mode.)"""


def _only(found: list[dict], what: str) -> dict:
    """The one row of ``found``; ClaimError where there is none or more than one (a rerun
    appended to the file)."""
    if len(found) != 1:
        raise ClaimError(f"{what}: {len(found)} rows, expected one")
    return found[0]


def _development_steps(rows: Rows, folder: str, steps: tuple, shapes: tuple) -> str:
    """fwd+bwd of each variant of the development calls ``steps`` ((file, commit), in ``folder``)
    at ``shapes`` (B, H, S, d), over the same call's default."""
    body = []
    for name, commit in steps:
        timed = [r for r in rows.select(f"{folder}/{name}.jsonl") if "fwd_bwd_ms" in r]
        for variant in dict.fromkeys(r["variant"] for r in timed):
            cells = [name, commit, variant]
            for shape in shapes:
                this, default = (_only([r for r in timed if tuple(r["shape"]) == shape and r["variant"] == v],
                                       f"{name} {v} {shape}") for v in (variant, "default"))  # fmt: skip
                cells += [fmt(this["fwd_bwd_ms"]), ratio_text(this["fwd_bwd_ms"], default["fwd_bwd_ms"])]
            body.append(cells)
    columns = [c for b, h, n, d in shapes for c in (f"{n // 1024}k d {d} ms", "x default")]
    return claim_block(
        "Development calls (`e124d15:benchmarks/attention/sm90_kernels.py --variants`: every variant checked "
        "against float64 first, then timed fwd+bwd in one process, `do_bench` medians in ms, bf16, "
        "causal; rows without provenance fields, the commit of each call beside it). "
        "x default = over the same call's default, single medians.",
        table(["call", "commit", "variant", *columns], body),
        "Rows: " + ", ".join(f"`{folder}/{name}.jsonl`" for name, _ in steps) + ".",
    )


@claim("attention-sm90-steps")
def attention_sm90_steps(rows: Rows) -> str:
    """Variant 9's development calls at 16k d 64 and 8k d 128."""
    return _development_steps(rows, ROUND_31, SM90_STEPS, ((1, 16, 16384, 64), (1, 16, 8192, 128)))


ROUND_32 = f"{ATTENTION}/32-round-h100"
D128_STEPS = (("sm90_v16_variants", "dd0627b"), ("sm90_v17_variants", "7a5a5e4"))
"""Variant 10's development calls, in order (each also times cuDNN, as the variant sdpa-cudnn)."""


@claim("attention-d128-steps")
def attention_d128_steps(rows: Rows) -> str:
    """Variant 10's development calls at the three long-context shapes."""
    return _development_steps(rows, ROUND_32, D128_STEPS, SM90_SHAPES)


DQ_AUTO_D128 = ((1, 16, 8192, 128), (1, 16, 32768, 128))
"""Variant 10's call: the five-matmul backward at head dim 128 too."""


@claim("attention-dq-auto-d128-fwd-bwd")
def attention_dq_auto_d128_fwd_bwd(rows: Rows) -> str:
    """Forward+backward at head dim 128, the five-matmul backward against the separate dQ kernel."""
    return _dq_modes(rows, ROUND_32, DQ_AUTO_D128, "fwd_bwd_ms")


@claim("attention-dq-auto-d128-bwd")
def attention_dq_auto_d128_bwd(rows: Rows) -> str:
    """Backward alone at head dim 128, the five-matmul backward against the separate dQ kernel."""
    return _dq_modes(rows, ROUND_32, DQ_AUTO_D128, "bwd_ms")


SM90_THRESHOLD_RUNS = (
    (f"{ATTENTION}/29-round-h100/classic.jsonl", "Triton kernels only"),
    (f"{ATTENTION}/30-round-h100/earlier/classic_b3c52fd.jsonl", "Gluon from 4096 keys"),
    (f"{ATTENTION}/30-round-h100/earlier/classic_38ba77d.jsonl", "Gluon from 2^29 of B*H*n_q*n_k"),
    (f"{ATTENTION}/30-round-h100/classic.jsonl", "Gluon from 2^36 of B*H*n_q*n_k*d (final)"),
)
"""The classic grid's bf16 runs under each choice of calls for the Gluon kernels, in order."""


@claim("attention-sm90-threshold")
def attention_sm90_threshold(rows: Rows) -> str:
    """flash-triton at the classic grid's batch-8 points near the Gluon kernels' work threshold,
    in the run of each threshold, with cuDNN of the same run beside it."""
    body, runs = [], []
    for path, rule in SM90_THRESHOLD_RUNS:
        used = []
        for d, n in ((64, 4096), (128, 4096), (64, 8192), (128, 8192)):
            point = dict(dtype="bf16", head_dim=d, seq_len=n)
            ours = rows.one(path, impl="flash-triton", **point)
            cudnn = rows.one(path, impl="sdpa-cudnn", **point)
            used += [ours, cudnn]
            kernels = (ours.get("flash_kernels") or {}).get("forward", "triton")
            body.append([rule, str(d), str(n), kernels, fmt(ours["fwd_ms"]), fmt(ours["fwd_bwd_ms"]),
                         fmt(cudnn["fwd_bwd_ms"]), ratio(ours, cudnn, key="fwd_bwd_ms", times=None)])
        runs.append(f"{rule}: {provenance(used)}.")
    return claim_block(
        "Classic grid (batch 8, one head, 3-d inputs: the Python Function), bf16, causal; `do_bench` "
        "medians in ms; ours / cuDNN in the same run (above 1: ours slower). Rows without "
        "`flash_kernels` predate the Gluon kernels. Each run is another call (machine), so "
        "compare runs by their ours / cuDNN column.",
        table(["choice of calls", "d", "seq", "kernels", "ours fwd", "ours fwd+bwd", "cuDNN fwd+bwd",
               "ours / cuDNN"], body),
        *runs,
    )


BEFORE_AFTER = ("after", "before", "after2")
"""The passes of e124d15:benchmarks/attention/before_after.sh, in the order they ran in one session."""


@claim("attention-host-before-after")
def attention_host_before_after(rows: Rows) -> str:
    """Host us per eager fwd+bwd (ours, SDPA) and issue 19's short shapes, with the source tree of
    the session's start (before) and the one with the new launch path (after, twice), in one GPU
    session."""
    return _host_before_after(rows, f"{ATTENTION}/27-round-h100")


@claim("attention-native-before-after")
def attention_native_before_after(rows: Rows) -> str:
    """The same with the Python host path (before) and the C++ host path (after, twice)."""
    return _host_before_after(rows, f"{ROUND_28}/first")


def _host_before_after(rows: Rows, folder: str) -> str:
    """The e124d15:benchmarks/attention/before_after.sh host and short-shape passes of ``folder``
    as two tables."""
    host_body, used_by_pass = [], {}
    for v in BEFORE_AFTER:
        found = {r["part"]: r for r in rows.select(f"{folder}/host_{v}.jsonl", status=None)}
        flash = found["flash: forward+backward through autograd"]
        sdpa = found["sdpa: forward+backward through autograd"]
        host_body.append([v, fmt(flash["host_us"]), fmt(sdpa["host_us"]),
                          f"{flash['host_us'] / sdpa['host_us']:.2f}x"])
        used_by_pass[v] = [flash, sdpa]
    shape_body = []
    for shape in ((8, 16, 1024, 64), (4, 25, 512, 64), (4, 32, 512, 80)):
        for v in BEFORE_AFTER:
            ours, best, found = _ours_and_fastest(rows, f"{folder}/small_{v}.jsonl", shape)
            shape_body.append([", ".join(map(str, shape)), v, fmt(ours["fwd_ms"]), fmt(ours["bwd_ms"]),
                               fmt(ours["fwd_bwd_ms"]), fmt(best["fwd_bwd_ms"]), best["impl"],
                               ratio(ours, best, key="fwd_bwd_ms", times="fwd_bwd_times_ms")])
            used_by_pass[v] += found
    return claim_block(
        "Shape (4, 25, 512, 64), bf16, causal; host microseconds per eager forward+backward through "
        "the public API (`e124d15:benchmarks/attention/host_public.py`: median of rounds of unsynchronized "
        "calls while a sleep kernel holds the GPU); flash / SDPA within the pass.",
        table(["pass", "flash us", "SDPA us", "flash / SDPA"], host_body),
        claim_block(
            "`lmscope attention` at issue 19's short shapes, bf16, causal; `do_bench` medians in ms; "
            "ours / fastest = our fwd+bwd over the faster SDPA backend's in the same pass, with the "
            "95 % bootstrap interval of the per-call times.",
            table(["B, H, S, d", "pass", "ours fwd", "ours bwd", "ours fwd+bwd", "fastest SDPA fwd+bwd",
                   "fastest", "ours / fastest"], shape_body),
            *[f"{v}: {provenance(used)}." for v, used in used_by_pass.items()],
        ),
    )


@claim("fast-step-before-after")
def fast_step_before_after(rows: Rows) -> str:
    """The fast training step (xl, 2.7B) with the session's first source tree and the one with the
    new launch path, one GPU session (e124d15:benchmarks/attention/before_after.sh)."""
    return _fast_before_after(rows, f"{ATTENTION}/27-round-h100")


@claim("fast-step-native-split")
def fast_step_native_split(rows: Rows) -> str:
    """The same with the third round's final code (C++ host path, split head dims) as after."""
    return _fast_before_after(rows, ROUND_28)


@claim("fast-step-issue19-final")
def fast_step_issue19_final(rows: Rows) -> str:
    """The fast step at every size, issue 19's final code against the code before the issue."""
    return _fast_before_after(rows, ROUND_32, ("small", "medium", "large", "xl", "2.7B"))


def _fast_before_after(rows: Rows, folder: str, sizes: tuple[str, ...] = ("xl", "2.7B")) -> str:
    """The e124d15:benchmarks/attention/before_after.sh fast-step passes of ``folder`` at ``sizes``
    as a table."""
    body, used = [], {}
    for size in sizes:
        found = {v: rows.one(f"{folder}/fast_{v}.jsonl", size=size) for v in BEFORE_AFTER}
        for v, r in found.items():
            used.setdefault(v, []).append(r)
        body.append([size, *(fmt(found[v]["median_ms"], 4) for v in BEFORE_AFTER),
                     ratio_interval(found["after"]["times_ms"], found["before"]["times_ms"]).as_text(),
                     ratio_interval(found["after2"]["times_ms"], found["before"]["times_ms"]).as_text()])
    return claim_block(
        "Train step, context 512, batch 4, bf16, flash attention, `--fast on` (CUDA graphs); median "
        "ms of 10 steps per pass; after / before with the 95 % bootstrap interval of the step times "
        "(two source trees, so two commits, measured in one session on one GPU).",
        table(["size", "after ms", "before ms", "after, again ms", "after / before",
               "after again / before"], body),
        *[f"{v}: {provenance(r)}." for v, r in used.items()],
    )


@claim("attention-wide-small")
def attention_wide_small(rows: Rows) -> str:
    """Ours with the default and the wide config lists at the short shapes, SDPA beside each."""
    return _passes_against_fastest(rows, ROUND_27, ("small", "small_wide"),
                                   ((8, 16, 1024, 64), (4, 25, 512, 64), (4, 32, 512, 80)),
                                   ("default", "wide"), "in the same pass")  # fmt: skip


def _passes_against_fastest(rows: Rows, folder: str, files: tuple[str, str], shapes: tuple,
                            labels: tuple[str, str], fastest_note: str) -> str:
    """Ours in two passes (``files``) at ``shapes``: fwd, bwd, fwd+bwd of each and its fwd+bwd
    over the faster SDPA backend measured beside it."""
    body, used = [], []
    for shape in shapes:
        line = [", ".join(map(str, shape))]
        for name in files:
            ours, best, found = _ours_and_fastest(rows, f"{folder}/{name}.jsonl", shape)
            used += found
            line += [fmt(ours["fwd_ms"]), fmt(ours["bwd_ms"]), fmt(ours["fwd_bwd_ms"]),
                     ratio(ours, best, key="fwd_bwd_ms", times="fwd_bwd_times_ms")]
        body.append(line)
    return claim_block(
        "bf16, causal; `do_bench` medians in ms; ours / fastest = fwd+bwd over the faster SDPA "
        f"backend {fastest_note}, with the 95 % bootstrap interval of the per-call times.",
        table(["B, H, S, d", *(f"{label} {col}" for label in labels
                               for col in ("fwd", "bwd", "fwd+bwd", "/ fastest"))], body),
        f"Measured on {provenance(used)}.",
    )


@claim("attention-host-native")
def attention_host_native(rows: Rows) -> str:
    """Host us per eager fwd+bwd: the C++ host path, the Python Function and SDPA in interleaved
    repeats of one process (e124d15:benchmarks/attention/host_native.py), per shape."""
    body, footers = [], []
    for name in ("host_native_xl", "host_native_27B"):
        found = rows.select(f"{ROUND_28}/first/{name}.jsonl", status=None)
        footers.append(f"{tuple(found[0]['shape'])}: {provenance(found)}.")
        by_part: dict[str, list[float]] = {}
        for r in found:
            by_part.setdefault(r["part"].rsplit(" (repeat", 1)[0], []).append(r["host_us"])
        sdpa = by_part["sdpa: forward+backward through autograd"]
        for part, values in by_part.items():
            ratios = [a / b for a, b in zip(values, sdpa, strict=True)]
            body.append([", ".join(map(str, found[0]["shape"])), part, str(len(values)),
                         fmt(statistics.median(values)), f"{statistics.median(ratios):.2f}x",
                         f"{min(ratios):.2f}x - {max(ratios):.2f}x"])
    return claim_block(
        "bf16, causal; host microseconds per eager forward+backward (`host_timing.host_us` each: "
        "median of rounds of unsynchronized calls while a sleep kernel holds the GPU), the three "
        "interleaved in each repeat; x SDPA = the part over SDPA in the same repeat (median and "
        "range over the repeats).",
        table(["B, H, S, d", "part", "repeats", "median us", "x SDPA median", "x SDPA range"], body),
        *footers,
    )


@claim("attention-split-head-dim")
def attention_split_head_dim(rows: Rows) -> str:
    """Head dim 80 as one padded tile (LMSCOPE_FLASH_SPLIT=0) and as 64 + 16 (the default), cuDNN
    and SDPA flash beside each, one GPU session."""
    return _passes_against_fastest(rows, ROUND_28, ("split_off", "split_on"),
                                   ((4, 32, 512, 80), (1, 16, 8192, 80)), ("padded", "split"),
                                   "in the same pass (cuDNN here)")  # fmt: skip


@claim("attention-engine-thread")
def attention_engine_thread(rows: Rows) -> str:
    """Host microseconds of eager forward+backward with and without the autograd device thread,
    and the backward split by stamping hooks, from the newest
    e124d15:benchmarks/attention/engine_thread.py run."""
    found = rows.select(f"{ATTENTION}/*/engine_thread.jsonl", status=None)  # its rows carry no status
    newest = max(found, key=lambda r: r["time"])
    run = newest_run(found, newest)
    us = {r["part"]: r["host_us"] for r in run}
    body = []
    for thread in ("device thread", "calling thread"):
        for what in ("forward+backward", "forward+backward, {t}, switch interval 1 us",
                     "forward+backward, {t}, gc off", "backward hand-off", "backward work",
                     "backward hand-back"):
            label = what.format(t=thread) if "{t}" in what else f"{what}, {thread}"
            sdpa, flash = us.get(f"sdpa: {label}"), us.get(f"flash: {label}")
            if sdpa is None or flash is None:
                continue
            body.append([label, fmt(sdpa), fmt(flash), ratio_text(flash, sdpa),
                         fmt(us.get(f"skeleton: {label}"))])
    return claim_block(
        f"Shape (B, H, S, d) = {tuple(newest['shape'])}, bf16, causal; host microseconds per call "
        "(forward+backward: median of rounds of unsynchronized calls, "
        "`e124d15:benchmarks/attention/host_timing.py`; hand-off, work and hand-back: medians of "
        "stamped backwards, `STAMPED_CALLS` in e124d15:benchmarks/attention/engine_thread.py, "
        "the stamping hooks included); skeleton = a Function that saves and allocates what flash "
        "does and nothing else.",
        table(["part", "SDPA us", "flash us", "flash / SDPA", "skeleton us"], body),
        f"Measured on {provenance(run)}.",
    )


def ratio_text(value: float, base: float) -> str:
    """value / base as '1.23x' (single measurements: no interval)."""
    return f"{value / base:.2f}x"


# The newest classic rows per dtype: bf16 with the five-matmul backward at head dims 64 and 128
# (32-round), fp32 from the grid before the Gluon kernels (the fp32 path, Triton kernels only, has
# not changed).
CLASSIC_GRIDS = (f"{ATTENTION}/32-round-h100/classic.jsonl", f"{ATTENTION}/29-round-h100/classic.jsonl")
CLASSIC_PEERS = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "naive", "naive-compiled",
                 "flash-torch")


@claim("attention-classic-ratios")
def attention_classic_ratios(rows: Rows) -> str:
    """Classic grid: fwd+bwd of each peer over flash-triton, only where both rows share a commit."""
    index: dict[tuple, dict] = {}
    for path in CLASSIC_GRIDS:  # newest first: a dtype's rows come from the newest file that has it
        found = rows.select(path)
        dtypes = {r["dtype"] for r in found} - {key[1] for key in index}
        index.update({(r["impl"], r["dtype"], r["head_dim"], r["seq_len"]): r
                      for r in found if r["dtype"] in dtypes})  # fmt: skip
    grid = list(index.values())
    body = []
    mixed = 0
    for dtype in ("bf16", "fp32"):
        for d in sorted({r["head_dim"] for r in grid}):
            for n in sorted({r["seq_len"] for r in grid}):
                ours = index.get(("flash-triton", dtype, d, n))
                if ours is None:
                    continue
                cells = [dtype, str(d), str(n), fmt(ours["fwd_bwd_ms"])]
                for peer in CLASSIC_PEERS:
                    other = index.get((peer, dtype, d, n))
                    if other is None:
                        cells.append("-")
                    elif code_identity(other) != code_identity(ours):
                        cells.append("other run")
                        mixed += 1
                    else:
                        cells.append(ratio(other, ours, key="fwd_bwd_ms", times=None))
                body.append(cells)
    return claim_block(
        "Batch 8, one head, causal; fwd+bwd ms of flash-triton and, per peer, peer / flash-triton "
        "(above 1: flash-triton faster; `-`: not measured or unavailable). A ratio is shown only "
        f"where both rows come from one commit; {mixed} cells are `other run`.",
        table(["dtype", "d", "seq", "flash-triton ms", *CLASSIC_PEERS], body),
        "Rows: " + ", ".join(f"`{path}`" for path in CLASSIC_GRIDS)
        + " (bf16 from the first, fp32 from the second).",
    )


XL_RUNS = ("5-all-sizes", "7-in-backward-peers", "14-xl-targets", "21-xl-targets-final")


@claim("fast-xl-runs")
def fast_xl_runs(rows: Rows) -> str:
    """Per run: the fast xl step (best mode) against HF and torch.compile of the same run."""
    body = []
    for run in XL_RUNS:
        pattern = f"{FAST}/{run}/bench.jsonl"
        point = dict(size="xl", context_length=512, precision="bf16", mode="train-step")
        fast = min(rows.select(pattern, fast=True, cuda_graph="auto", **point), key=lambda r: r["median_ms"])
        hf = rows.one(pattern, peer="hf", **point)
        compiled = rows.one(pattern, compile=True, fast=False, **point)
        body.append([run.split("-")[0], fmt(fast["median_ms"], 4), fmt(hf["median_ms"], 4), ratio(hf, fast),
                     fmt(compiled["median_ms"], 4), ratio(compiled, fast), fast["git_sha"]])
    return claim_block(
        "xl, bf16, batch 4, context 512, train step; median ms; ratio = peer / fast with its 95 % "
        "bootstrap interval over the steps (`~`: inside the noise). Targets: 2.5x against HF, 1.3x "
        "against torch.compile.",
        table(["run", "fast ms", "HF ms", "vs HF", "compile ms", "vs compile", "git"], body),
        f"Rows: `{FAST}/<run>/bench.jsonl`.",
    )


FSDP_X2 = "benchmarks/results/distributed/fsdp-x2-h200"


def _sharded_against_single(label: str, by: dict[str, dict], last: Callable[[dict], str],
                            single_last: str) -> list[list[str]]:
    """Table rows of our FSDP (and its variant with the reduce-scatters on a group of their own,
    where the run has it), FSDP2 and the best DDP of one run (`by` strategy) against its
    single-GPU step, FSDP2 against ours, then the single step; `last` fills the last column."""
    single, peer = by["single"], by["torch-fsdp2"]
    ours = sorted(name for name in by if name != BASELINE and parse_strategy(name)[0] == "fsdp")
    body = [[label, name, fmt(by[name]["step_median_ms"], 4), ratio(by[name], single),
             ratio(peer, by[name]) if name in ours else "", last(by[name])]
            for name in (*ours, "torch-fsdp2", "coalesced:1000")]
    return [*body, [label, "single (1 GPU)", fmt(single["step_median_ms"], 4), "", "", single_last]]


@claim("fsdp-x2")
def fsdp_x2(rows: Rows) -> str:
    """xl and 2.7B on 2 ranks: our FSDP, PyTorch's FSDP2 and the best DDP in one run per size."""
    def memory(row: dict) -> str:
        if "predicted_fsdp_peak_gib" not in row:
            return fmt(row["peak_after_optimizer_gib"])
        return f"{fmt(row['peak_after_optimizer_rank_max_gib'])} / {fmt(row['predicted_fsdp_peak_gib'])}"

    body = []
    for size in ("xl", "2.7B"):
        by = {r["strategy"]: r for r in rows.select(f"{FSDP_X2}/fsdp-{size}-x2.jsonl")}
        body += _sharded_against_single(size, by, memory, memory(by["single"]))
    return claim_block(
        "bf16, context 512, batch 4 per rank, 2x H200; median ms per step; `step/single` = the "
        "2-rank step over the single-GPU step of the same run, `FSDP2/ours` = PyTorch's FSDP2 step "
        "over ours, each with its 95 % bootstrap interval over the steps; peak GiB per rank, "
        "measured / predicted by `lmscope.accounting.fsdp`.",
        table(["size", "strategy", "step ms", "step/single", "FSDP2/ours", "peak GiB"], body),
        f"Rows: `{FSDP_X2}/fsdp-<size>-x2.jsonl`; {provenance(rows.load(f'{FSDP_X2}/fsdp-xl-x2.jsonl'))}.",
    )


@claim("fsdp-8b-long")
def fsdp_8b_long(rows: Rows) -> str:
    """The 8B long-context step on 2 ranks: ours per attention kernel against the HF FSDP2 peer."""
    from lmscope.accounting.devices import peak_tflops
    from lmscope.accounting.flops import step_flops
    from lmscope.config import ModelConfig

    peer = rows.one(f"{FSDP_X2}/llama-peer.jsonl")
    config = ModelConfig(vocab_size=peer["vocab_size"], context_length=peer["context_length"],
                         d_model=peer["d_model"], d_ff=peer["d_ff"], num_layers=peer["num_layers"],
                         num_heads=peer["num_heads"])
    flops = step_flops(config, peer["batch_size"] * peer["world_size"], peer["context_length"], "train-step")
    peak = peak_tflops(peer["device_name"], "bf16") * 1e12 * peer["world_size"]
    body = []
    for attention in ("sdpa-cudnn", "flash"):
        row = rows.one(f"{FSDP_X2}/fsdp-8b-{attention}.jsonl", strategy="fsdp")
        body.append([f"lmscope fsdp, fast, {attention}, checkpoint {row['checkpoint']}",
                     fmt(row["step_median_ms"], 4), ratio(peer, row, times="times_ms"),
                     fmt(flops / (row["step_median_ms"] / 1e3) / peak),
                     fmt(row["peak_after_optimizer_rank_max_gib"])])
    body.append(["HF Llama, SDPA, full checkpointing, FSDP2 (peer)", fmt(peer["step_median_ms"], 4), "",
                 fmt(flops / (peer["step_median_ms"] / 1e3) / peak),
                 fmt(peer["peak_allocated_rank_max_gib"])])
    return claim_block(
        "d 4096, d_ff 11008, 34 layers, 32 heads, vocab 151,936; context 32,768, batch 1 per rank, "
        "2x H200, bf16, AdamW; median ms per step (warm-up 1, 3 steps); `peer/ours` with its 95 % "
        "bootstrap interval; MFU = model FLOPs without recompute (`lmscope.accounting.flops`, causal "
        "attention as half the square: "
        f"{fmt(flops / 1e15)} PFLOP per step) over the datasheet's dense bf16 peak of both GPUs; "
        "peak GiB allocated per rank.",
        table(["step", "ms", "peer/ours", "MFU", "peak GiB"], body),
        f"Rows: `{FSDP_X2}/fsdp-8b-<attention>.jsonl`, `llama-peer.jsonl`; {provenance([peer])}.",
    )


ATTENTION_KERNELS = {
    "ours": ("16-long-sdpa-inbwd-profile",
             ("_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq", "_bwd_preprocess")),
    "sdpa": ("17-attention-at-512", ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop",
                                     "cudnn_generated_fort_native_sdpa_sm90_flash_bprop",
                                     "compute_dot_do_o_specialized", "convert_dq_to_16bits",
                                     "elementwise_kernel (direct_copy_kernel_cuda)")),
}
"""Per attention backend: the run whose xl fast-step profile holds it, and its kernels (prefixes of
short names). SDPA's last one is the copy that merges heads from its (B, H, T, d) output."""


@claim("fast-attention-kernels-xl")
def fast_attention_kernels_xl(rows: Rows) -> str:
    """Per-layer and per-step attention kernel time in the xl fast step, ours against SDPA (cuDNN)."""
    body, totals, backward, runs = [], {}, {}, []
    for backend, (run, prefixes) in ATTENTION_KERNELS.items():
        point = rows.one(f"{FAST}/{run}/profile.jsonl", size="xl", context_length=512, fast=True)
        kernels = [r for r in rows.load(f"{FAST}/{run}/profile_kernels.csv")
                   if r["phase"] in ("forward", "backward") and float(r["instances_per_step"]) == 48
                   and r["short_name"].startswith(prefixes)]
        for prefix in prefixes:
            hits = [r for r in kernels if r["short_name"].startswith(prefix)]
            if len(hits) != 1:
                raise ClaimError(f"{len(hits)} kernels named {prefix}* at 48 per step in run {run}")
        for r in kernels:
            body.append([backend, r["phase"], f"`{r['short_name'][:48]}`", fmt(float(r["avg_us"]))])
        totals[backend] = sum(float(r["avg_us"]) for r in kernels)
        backward[backend] = sum(float(r["avg_us"]) for r in kernels if r["phase"] == "backward")
        runs.append(f"{backend}: run {run}, git {point['git_sha']}, attention={point['attention']}")
    return claim_block(
        "xl fast step (batch 4, context 512, bf16, optimizer in the backward), kernels that run once "
        "per layer (48 per step), mean us per call from the profiles:",
        table(["backend", "phase", "kernel", "us per layer"], body),
        f"Per layer: ours {fmt(totals['ours'])} us, SDPA {fmt(totals['sdpa'])} us; per step "
        f"(x 48): ours {fmt(totals['ours'] * 48 / 1000)} ms, SDPA {fmt(totals['sdpa'] * 48 / 1000)} ms. "
        "Backward alone: ours "
        f"{fmt(backward['ours'])} us, SDPA {fmt(backward['sdpa'])} us per layer. "
        "The two profiles come from two commits, so no ratio is drawn: "
        + "; ".join(runs) + f". Rows: `{FAST}/<run>/profile_kernels.csv`.",
    )


ABLATION_8B = "benchmarks/results/distributed/8b-ablation-x2-h200"
"""Issue 37's 8B long-context ablation on 2x H200 (`benchmarks/distributed/run_8b_ablation.sh`)."""


@claim("fsdp-8b-ablation")
def fsdp_8b_ablation(rows: Rows) -> str:
    """The ablation's table (`summarize_8b_ablation.py`): one row per policy with its call's peer."""
    from lmscope.records.provenance import code_identity

    summary = _benchmark_script("distributed/summarize_8b_ablation.py")
    by_code: dict[str, dict[str, list]] = {}  # the rows with numbers, by the code that ran them
    for name in ("full", "planned", "selective", "offload", "best"):
        for r in rows.load(f"{ABLATION_8B}/ablation-{name}.jsonl"):
            if r.get("status") == "ok":
                by_code.setdefault(code_identity(r), {}).setdefault(name, []).append(r)
    runs = "; ".join(f"{', '.join(named)}: {provenance([r for found in named.values() for r in found])}"
                     for named in by_code.values())
    return claim_block(
        "d 4096, d_ff 11008, 34 layers, 32 heads, vocab 151,936; context 32,768, batch 1 per rank, "
        "2x H200, bf16, lmscope FSDP with `--fast on` and our flash attention, AdamW; median ms per "
        "step (warm-up 1, 3 steps, rank 0); peak GiB per rank measured (largest over ranks) beside "
        "`lmscope.accounting.fast_memory`'s prediction; model-FLOPs MFU (causal attention at half "
        "the square) over both GPUs' dense bf16 peak; the HF Llama FSDP2 peer from the same call.",
        summary.table(ROOT / ABLATION_8B).strip(),
        f"Rows: `{ABLATION_8B}/ablation-<row>.jsonl`, `llama-peer-<call>.jsonl`, `plans.json`, "
        f"`profile-best.jsonl`. By the code that ran them: {runs}.",
    )


DISTRIBUTED = "benchmarks/results/distributed"
DDP_RUNS = ("ddp-x2-batch16", "ddp-x2-paired")
"""The 2-GPU xl DDP sweeps whose rows carry the overhead model's prediction: batch 16 per rank
(the GPU bounds the step), then the study's batch 4 (the host bounds it)."""


@claim("ddp-exposed-comm")
def ddp_exposed_comm(rows: Rows) -> str:
    """Per strategy of each sweep: the step against its paired baseline, and the communication
    left after backward, measured beside what the overhead model predicts for it."""
    body, footers = [], []
    for run in DDP_RUNS:
        pattern = f"{DISTRIBUTED}/{run}/ddp.jsonl"
        found = [r for r in rows.select(pattern) if r["strategy"] != "single"]
        for r in sorted(found, key=lambda r: r["predicted_comm_wait_ms"]):
            body.append([str(r["batch_size"]), r["strategy"], str(r["buckets"]), fmt(r["step_median_ms"], 4),
                         fmt(r["local_step_ms"], 4), fmt(r["overhead_vs_local_pct"]),
                         fmt(r["comm_wait_ms"]), fmt(r["predicted_comm_wait_ms"])])
        footers.append(f"batch {found[0]['batch_size']}: {provenance(found)}.")
    return claim_block(
        "xl, bf16, context 512, 2x H200, unsharded optimizer; median ms per step; local = the same "
        "step unwrapped on the same ranks just before (the paired baseline); exposed communication "
        "= `comm_wait_ms`, the wait for the gradients after backward (`-`: `torch-ddp` does not "
        "expose it), beside `predicted_comm_wait_ms` of the overhead model with the point's own "
        "all-reduce fit.",
        table(["batch", "strategy", "buckets", "step ms", "local ms", "overhead %", "exposed ms",
               "predicted ms"], body),
        *footers,
    )


OVERLAP_RUNS = {
    "fsdp-overlap": (f"{DISTRIBUTED}/fsdp-overlap-x2", "overlap-xl-x2", ()),
    "fsdp-overlap-x2-hooks": (f"{DISTRIBUTED}/fsdp-overlap-x2-hooks", "overlap-xl-x2", ()),
    "fsdp-overlap-x4": (f"{DISTRIBUTED}/fsdp-overlap-x4", "overlap-xl-x4", ("before",)),
    "fsdp-overlap-x2-reduce-group": (f"{DISTRIBUTED}/fsdp-overlap-x2-reduce-group", "overlap-xl-x2", ()),
    "fsdp-overlap-x4-reduce-group": (f"{DISTRIBUTED}/fsdp-overlap-x4-reduce-group", "overlap-xl-x4", ()),
}
"""Issue 37's FSDP overlap runs (`run_fsdp_gpu.sh`'s overlap stage: xl, interleaved rounds, then
profiled steps), claim name -> (folder, file stem, subfolders with earlier code's profiles of the
same run, shown above its own): 2 ranks at batches 4 and 8; 2 ranks at batch 8 with less host time
in the hooks; 4 ranks, before and after that change; 2 and 4 ranks at batch 8 with the views fixed
and the reduce group of its own beside. Each gives `<name>` and `<name>-profile`."""


ByPoint = dict[tuple[int, str], dict]
"""Rows by (batch, strategy)."""


def _overlap_rows(rows: Rows, folder: str, stem: str) -> tuple[ByPoint, ByPoint]:
    """(timed rows with their rounds pooled, profiled rows), each by (batch, strategy)."""
    from lmscope.report.rounds import pool_rounds
    from lmscope.running.runner import spec_fields

    timed = pool_rounds(rows.select(f"{folder}/{stem}.jsonl"), spec_fields("ddp"))
    profiled = rows.select(f"{folder}/{stem}-profile.jsonl")
    return ({(r["batch_size"], r["strategy"]): r for r in timed},
            {(r["batch_size"], r["strategy"]): r for r in profiled})


def _bound(profiled: dict) -> str:
    """'host' or 'GPU', by the GPU's busy share of the timed step (`lmscope.measure.host_bound`)."""
    from lmscope.measure.host_bound import is_host_bound

    busy = profiled["profile_gpu_busy_pct"]
    return f"{'host' if is_host_bound(busy / 100) else 'GPU'} (GPU busy {fmt(busy, 2)} %)"


def fsdp_overlap(rows: Rows, folder: str, stem: str) -> str:
    """Our FSDP, FSDP2 and the best DDP against the single-GPU step at xl, per batch, rounds pooled."""
    from lmscope.measure.host_bound import HOST_BOUND_BELOW

    timed, profiled = _overlap_rows(rows, folder, stem)
    body = []
    for batch in sorted({b for b, _ in timed}):
        by = {strategy: row for (b, strategy), row in timed.items() if b == batch}
        body += _sharded_against_single(str(batch), by, lambda row: "", _bound(profiled[batch, "single"]))
    ours = next(row for (_, strategy), row in timed.items() if strategy == "fsdp")
    return claim_block(
        f"{ours['size']}, {ours['precision']}, context {ours['context_length']}, {ours['world_size']} ranks, "
        "batch per rank as given; median ms per "
        f"step ({ours.get('rounds', 1)} round(s) of interleaved points); "
        "`step/single` = the step over the single-GPU step, `FSDP2/ours` = PyTorch's FSDP2 step over "
        "ours, each with its 95 % bootstrap interval, which resamples the rounds (three a side at "
        "least) where the rows pooled several; the single step is host-bound "
        f"where the GPU was busy for less than {100 * HOST_BOUND_BELOW:.0f} % of it "
        "(`lmscope.measure.host_bound.HOST_BOUND_BELOW`, from its profile).",
        table(["batch", "strategy", "step ms", "step/single", "FSDP2/ours", "bound by"], body),
        f"Rows: `{folder}/{stem}.jsonl`; {provenance(list(timed.values()))}.",
    )


def fsdp_overlap_profile(rows: Rows, folder: str, stem: str, earlier: tuple[str, ...]) -> str:
    """Where our FSDP step and the single-GPU step go on the GPU, per batch (profiled steps), the
    earlier code's profiles of the same run first."""
    from lmscope.records.provenance import code_identity

    paths = [f"{folder}/{sub}/{stem}-profile.jsonl" for sub in earlier] + [f"{folder}/{stem}-profile.jsonl"]
    found = [r for path in paths for r in rows.select(path)]
    body = []
    for row in found:
        code = (row.get("git_sha_declared") or row.get("git_sha") or "?")[:7]
        body.append([code, str(row["batch_size"]), row["strategy"], fmt(row["step_median_ms"], 4),
                     fmt(row["profile_step_ms"], 4), fmt(row["profile_compute_ms"]),
                     fmt(row["profile_exposed_comm_forward_ms"]),
                     fmt(row["profile_exposed_comm_backward_ms"]), fmt(row["profile_exposed_comm_ms"]),
                     fmt(row["profile_idle_ms"]), fmt(row["profile_wrapper_host_ms"]),
                     fmt(100 * row["profile_compute_ms"] / row["step_median_ms"], 2),
                     fmt(row["profile_gpu_busy_pct"], 2) if not row.get("profile_comm_ms") else "-"])
    first = found[0]
    by_code: dict[str | None, list[dict]] = {}
    for row in found:
        by_code.setdefault(code_identity(row), []).append(row)
    return claim_block(
        f"{first['size']}, {first['precision']}, context {first['context_length']}; per rank (mean over "
        "ranks) and step, by the code that ran it: the timed step, the profiled step, "
        "then on the GPU timeline (`lmscope ddp --profile-steps`, `lmscope.measure.overlap`) compute, "
        "communication with no compute beside it (exposed) by the phase that launched it and in all, "
        "idle, the host time inside the FSDP hooks, ms; then the compute kernels' share of the timed "
        "step, and the GPU's busy share (compute and exposed communication) of it where the step "
        "has no collectives (a collective's kernel spins while it waits for the other ranks, longer "
        "under the profiler, so its time is not the GPU's work: `-`).",
        table(["code", "batch", "strategy", "step ms", "profiled ms", "compute", "exposed fwd", "exposed bwd",
               "exposed", "idle", "hooks (host)", "compute %", "GPU busy %"], body),
        f"Rows: {', '.join(f'`{path}`' for path in paths)}; "
        f"{'; '.join(provenance(same) for same in by_code.values())}.",
    )


for _name, (_folder, _stem, _earlier) in OVERLAP_RUNS.items():
    claim(_name)(functools.partial(fsdp_overlap, folder=_folder, stem=_stem))
    claim(f"{_name}-profile")(functools.partial(fsdp_overlap_profile, folder=_folder, stem=_stem,
                                                earlier=_earlier))


OWN_SPEEDUP = "benchmarks/results/own_model/speedup"
"""Where the rows of benchmarks/own_model/speedup_gpu.sh are committed (issue 38)."""


@claim("own-model-speedup")
def own_model_speedup(rows: Rows) -> str:
    """transformers' Llama-family models eager, compiled, with Liger-Kernel and with lmscope's fast
    path, in one call: the grouping and lmscope's fastest row of benchmarks/own_model/speedup_summary.py."""
    found = rows.load(f"{OWN_SPEEDUP}/bench.jsonl")
    summary = _benchmark_script("own_model/speedup_summary.py")
    body = []
    for model, setups in summary.grouped(found).items():
        fast = summary.best_fast(setups)
        for name in summary.setups_of(setups):
            row = setups.get(name)
            if row is None:
                continue
            if row.get("status") != "ok":
                body.append([model, name, str(row.get("status")).upper(), "", "", "", "", ""])
                continue
            mfu = row.get("mfu_counted")
            body.append([model, name, fmt(row["median_ms"], 4), fmt(row.get("peak_allocated_gib")),
                         fmt(row.get("tokens_per_s")), fmt(mfu * 100 if mfu is not None else None),
                         fmt(row.get("compile_s")), "" if row is fast or fast is None else ratio(row, fast)])
    return claim_block(
        "bf16 autocast over fp32 weights, train step with fused AdamW (lmscope: FusedAdamW, CUDA graphs), "
        "random weights; median ms per step (rounds pooled); `step / lmscope` = the setup's median step "
        "over lmscope's fastest, with its 95 % bootstrap interval (over the rounds where the rows "
        "pooled several, else over the steps); MFU from the FLOPs counted over one step; compile s: "
        "the longest round's.",
        table(["model", "setup", "step ms", "peak GiB", "tokens/s", "MFU %", "compile s", "step / lmscope"],
              body),
        f"Rows: `{OWN_SPEEDUP}/bench.jsonl` (benchmarks/own_model/speedup_gpu.sh); {provenance(found)}.",
    )


HOST_STATE = f"{DISTRIBUTED}/host-optimizer-state-1gpu-h200"
"""`lmscope ddp --optimizer-state device,host` on one GPU (issue 37)."""
HOST_STATE_FILES = ("host-state-10l.jsonl", "combo-10l.jsonl")


@claim("fsdp-host-optimizer-state")
def fsdp_host_optimizer_state(rows: Rows) -> str:
    """FSDP with AdamW's moments on the device and on the host, rounds pooled: step, memory; per
    file of `HOST_STATE` (selective recompute in three rounds; the 8B rows' treatments and cuDNN in one)."""
    from lmscope.report.rounds import pool_rounds
    from lmscope.running.runner import spec_fields

    body, footers = [], []
    for name in HOST_STATE_FILES:
        pooled = pool_rounds(rows.select(f"{HOST_STATE}/{name}"), spec_fields("ddp"))
        by = {(r["strategy"], r["optimizer_state"]): r for r in pooled}
        device = by["fsdp", "device"]
        body += [[f"{row['checkpoint']}, {row['attention']}", str(row.get("rounds", 1)), strategy, where,
                  fmt(row["step_median_ms"], 4),
                  ratio(row, device) if row is not device and strategy == "fsdp" else "",
                  fmt(row["peak_after_optimizer_rank_max_gib"]),
                  fmt(row.get("after_step_allocated_rank_max_gib")),
                  fmt(row.get("predicted_fsdp_state_gib")), fmt(row.get("optimizer_host_gib"))]
                 for (strategy, where), row in by.items()]
        footers.append(f"`{name}`: {provenance(pooled)}")
    first = pooled[0]
    return claim_block(
        f"d {first['d_model']}, d_ff {first['d_ff']}, {first['num_layers']} layers, "
        f"{first['num_heads']} heads, vocab {first['vocab_size']:,}; context {first['context_length']:,}, "
        f"batch {first['batch_size']}, {first['precision']}, `--fast on`, lmscope FSDP on "
        f"{first['world_size']} GPU; median ms per step over the interleaved rounds; `x device` = the "
        "step over the step with the moments on the device, with the 95 % interval that resamples the "
        "rounds (three a side at least), else the steps; peak GiB through the step, GiB allocated after "
        "it (predicted: `lmscope.accounting.fsdp`'s state), GiB of moments in pinned host memory.",
        table(["checkpoint, attention", "rounds", "strategy", "moments", "step ms", "x device", "peak GiB",
               "after step GiB", "predicted after step GiB", "host GiB"], body),
        f"Rows in `{HOST_STATE}/`, by the code that ran them: {'; '.join(footers)}.",
    )


ATTENTION_8B = f"{FAST}/8b-shape-attention-h200"
"""The 8B long-context shape's step on one GPU with lmscope's attention and SDPA's cuDNN (issue 37)."""


@claim("fast-8b-shape-attention")
def fast_8b_shape_attention(rows: Rows) -> str:
    """The fast step at the 8B shape (fewer layers) with flash against sdpa-cudnn, rounds pooled."""
    from lmscope.report.rounds import pool_rounds
    from lmscope.running.runner import spec_fields

    pooled = pool_rounds(rows.select(f"{ATTENTION_8B}/attn8b6.jsonl"), spec_fields("bench"))
    by = {r["attention"]: r for r in pooled}
    flash, cudnn = by["flash"], by["sdpa-cudnn"]
    body = [["flash (lmscope)", fmt(flash["median_ms"], 4), ratio(flash, cudnn)],
            ["sdpa-cudnn", fmt(cudnn["median_ms"], 4), ""]]
    return claim_block(
        f"d {flash['d_model']}, d_ff {flash['d_ff']}, {flash['num_layers']} layers, "
        f"{flash['num_heads']} heads, vocab {flash['vocab_size']:,}; context {flash['context_length']:,}, "
        f"batch {flash['batch_size']}, "
        f"{flash['precision']}, `--fast on`, train step, one GPU; median ms per step "
        f"({flash.get('rounds', 1)} interleaved rounds, each point in a fresh process); `x cuDNN` = "
        "the step over the step with SDPA's cuDNN attention, with the 95 % interval that resamples "
        "the rounds.",
        table(["attention", "step ms", "x cuDNN"], body),
        f"Rows: `{ATTENTION_8B}/attn8b6.jsonl`; {provenance(pooled)}.",
    )


OWN_CURVES = "benchmarks/results/own_model/curves"
"""Where the rows of benchmarks/own_model/train_curves.py are committed (issue 38)."""


@claim("own-model-curves")
def own_model_curves(rows: Rows) -> str:
    """transformers' model and the same model through lmscope's fast path, trained side by side:
    each run's comparison row (tail means, largest step difference), with and without warmup."""
    body = []
    for name in ("curves-no-warmup", "curves"):
        found = rows.load(f"{OWN_CURVES}/{name}.jsonl")
        row = next(r for r in found if r.get("run") == "comparison")
        # rows from before --warmup-steps and --clip-grad-norm existed ran with neither
        body.append([f"{name}.jsonl", str(row["steps"]), fmt(row["lr"]), str(row.get("warmup_steps", 0)),
                     fmt(row.get("clip_grad_norm")) if row.get("clip_grad_norm") else "none",
                     fmt(row["first_loss"], 4), fmt(row["tail_mean_transformers"], 4),
                     fmt(row["tail_mean_fast"], 4), fmt(row["max_abs_difference"], 4)])
    first = found[0]  # the last file's: the current recipe
    return claim_block(
        f"{first['model'].removeprefix('hf:')}, batch {first['batch_size']} x {first['context_length']}, "
        f"{first['precision']} autocast, one fixed synthetic token stream, the same initial weights; "
        "transformers' model (SDPA, torch's AdamW) against the same model after "
        "`apply_to_hf_model` (FusedAdamW with bf16 weight copies); mean loss over the last tenth of "
        "the steps, and the largest difference between the two runs' losses at one step.",
        table(["rows", "steps", "lr", "warmup", "clip", "first loss", "transformers, tail",
               "lmscope fast, tail", "largest step difference"], body),
        f"Rows: `{OWN_CURVES}/curves.jsonl`, `curves-no-warmup.jsonl` "
        f"(benchmarks/own_model/train_curves.py); {provenance(found)}.",
    )


def _benchmark_script(relative: str):
    """A script under benchmarks/, imported by its path (its folder is not a package)."""
    import importlib.util

    path = ROOT / "benchmarks" / relative
    spec = importlib.util.spec_from_file_location(f"lmscope_benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ATTENTION_ROUNDS = {"attention-rounds": f"{ATTENTION}/33-rounds-h100/rounds.jsonl",
                    "attention-rounds-h200": f"{ATTENTION}/34-rounds-h200/rounds.jsonl"}
"""Issue 34's attention headlines in interleaved rounds (`benchmarks/attention/run_rounds.sh`),
claim name -> rows: five shapes on an H100, then all six on an H200."""


def attention_rounds(rows: Rows, path: str) -> str:
    """Ours against SDPA's flash and cuDNN kernels at issue 19's shapes, every round a fresh
    process: medians pooled over the rounds, ratios with the interval that resamples rounds."""
    from lmscope.report.rounds import pool_rounds, ratio_between
    from lmscope.running.runner import spec_fields

    found = rows.select(path)
    pooled = pool_rounds(found, spec_fields("attention"))
    by = {(r["batch"], r["heads"], r["seq_len"], r["head_dim"], r["impl"]): r for r in pooled
          if r.get("status") == "ok"}
    body = []
    for shape in ISSUE19_SHAPES:
        ours, flash, cudnn = (by.get((*shape, impl)) for impl in ("flash-triton", "sdpa-flash", "sdpa-cudnn"))
        if not (ours and flash and cudnn):
            body.append([", ".join(map(str, shape)), "not measured", "", "", "", "", ""])
            continue
        best = min((flash, cudnn), key=lambda r: r["fwd_bwd_ms"])
        interval = ratio_between(ours, best, "fwd_bwd_times_ms")
        calls = len(ours["fwd_bwd_times_ms"])
        body.append([", ".join(map(str, shape)), fmt(ours["fwd_bwd_ms"]), fmt(flash["fwd_bwd_ms"]),
                     fmt(cudnn["fwd_bwd_ms"]), best["impl"], interval.as_text() if interval else "-",
                     f"{ours.get('rounds', 1)} x {calls // max(ours.get('rounds', 1), 1)}"])
    return claim_block(
        "fwd+bwd, bf16, causal; `do_bench` medians in ms pooled over interleaved rounds (each round "
        "one fresh process running the three implementations); ours / fastest = flash-triton over the "
        "faster SDPA backend (above 1: ours slower), with the 95 % interval that resamples the rounds "
        "(`lmscope.stats.ratio_interval_rounds`; `~`: it holds 1); n = rounds x calls per round of ours. "
        "Target: at most 1.1x at every shape.",
        table(["B, H, S, d", "ours ms", "SDPA flash ms", "SDPA cuDNN ms", "fastest SDPA", "ours / fastest",
               "n"], body),
        f"Rows: `{path}` (`benchmarks/attention/run_rounds.sh`); {provenance(found)}.",
    )


for _name, _path in ATTENTION_ROUNDS.items():
    claim(_name)(functools.partial(attention_rounds, path=_path))


STRONGEST_PEERS = {"fast-strongest-peers": f"{FAST}/26-strongest-peers-h200",
                   "fast-strongest-peers-h100": f"{FAST}/25-strongest-peers",
                   "fast-max-autotune-h200": f"{FAST}/34-max-autotune-h200"}
"""Issue 34's runs, claim name -> folder: the fast xl step against eager SDPA, torch.compile in each
mode and HF (eager and compiled); three rounds on H200s, the first run (one round on an H100), and
`max-autotune-no-cudagraphs` in rounds on an H200."""


def strongest_peers(folder: str) -> Callable[[Rows], str]:
    """The 'Peers at their strongest' table of benchmarks/fast/summarize.py over one of issue 34's runs."""
    def render(rows: Rows) -> str:
        summary = _benchmark_script("fast/summarize.py")
        found = rows.load(f"{folder}/bench.jsonl")
        lines = summary.strongest_peers(summary.latest(ROOT / folder / "bench.jsonl"))
        if not lines:
            raise ClaimError(f"{folder}/bench.jsonl has no compile-mode rows beside the fast step")
        caption, body = lines[1].strip(), "\n".join(lines[2:])
        return claim_block(caption, body,
                           f"Rows: `{folder}/bench.jsonl` (`benchmarks/fast/run_strongest_peers.sh`); "
                           f"{provenance(found)}.")
    return render


for _name, _folder in STRONGEST_PEERS.items():
    claim(_name)(strongest_peers(_folder))


CURRENT_ROWS = {
    "attention": ("34-rounds-h200/rounds.jsonl", "33-rounds-h100/rounds.jsonl",
                  "32-round-h100/leaderboard.jsonl",
                  "32-round-h100/attention_shapes.jsonl", "32-round-h100/tflops.jsonl",
                  "32-round-h100/classic.jsonl", "29-round-h100/classic.jsonl"),
    "fast": ("26-strongest-peers-h200/bench.jsonl", "25-strongest-peers/bench.jsonl",
             "34-max-autotune-h200/bench.jsonl",
             "21-xl-targets-final/bench.jsonl",
             "22-sizes-final/bench.jsonl"),
    "distributed": ("comm.jsonl", "ddp-x2-batch16/ddp.jsonl",
                    "ddp-x2-paired/ddp.jsonl", "fsdp-x2-h200/fsdp-xl-x2.jsonl",
                    "fsdp-x2-h200/fsdp-2.7B-x2.jsonl", "fsdp-x2-h200/fsdp-8b-flash.jsonl",
                    "fsdp-overlap-x2/overlap-xl-x2.jsonl",
                    "fsdp-overlap-x2-hooks/overlap-xl-x2.jsonl", "fsdp-overlap-x4/overlap-xl-x4.jsonl",
                    "8b-ablation-x2-h200/ablation-planned.jsonl",
                    "8b-ablation-x2-h200/ablation-offload.jsonl",
                    "fsdp-single-h100/fsdp-single.jsonl"),
    "bench": ("bench.jsonl", "bench_warmup.jsonl"),
    "memory": ("results.jsonl", "activations-h100/results.jsonl"),
    "own_model": ("bench.jsonl", "profile.jsonl", "memory.jsonl", "fidelity.jsonl", "speedup/bench.jsonl"),
    "plan": ("bench.jsonl",),
    "profile": ("results.jsonl",),
    "stats": ("coverage.jsonl", "bench-runs/*.jsonl"),
    "study-cpu": ("*.jsonl",),
    "study-h100": ("*.jsonl",),
}
"""Per results area, the files of its current canonical rows (under benchmarks/results), which
the area's README names with the command that made them."""


def current_rows(area: str) -> Callable[[Rows], str]:
    """The claim that lists `area`'s current rows files: rows, device, dates, newest code."""
    def render(rows: Rows) -> str:
        body = []
        for relative in CURRENT_ROWS[area]:
            found = rows.load(f"benchmarks/results/{area}/{relative}")
            devices = sorted({str(r["device_name"]) for r in found if r.get("device_name")})
            days = sorted({str(r["time"])[:10] for r in found if r.get("time")})
            newest = max(found, key=lambda r: str(r.get("time", "")))
            body.append([f"`{relative}`", str(len(found)), ", ".join(devices) or "-",
                         days[0] if len(set(days)) == 1 else f"{days[0]} to {days[-1]}",
                         str(code_identity(newest))])
        return claim_block("The current rows, from their provenance fields.",
                           table(["rows file", "rows", "device", "measured", "code of the newest row"], body))
    return render


for _area in CURRENT_ROWS:
    claim(f"current-{_area}")(current_rows(_area))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true",
                      help="fail when a block is stale or a claim has no row")
    mode.add_argument("--write", action="store_true", help="rewrite every generated block from the rows")
    parser.add_argument("files", nargs="*", type=Path, help="docs to process (default: all)")
    args = parser.parse_args(argv)
    files = [f.resolve() for f in args.files] or doc_files()
    problems = check_files(files, REGISTRY, write=args.write, scope=scope)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"{len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"claims: {len(files)} files, every number from rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
