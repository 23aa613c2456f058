"""Correctness + timing of lmscope's Triton FlashAttention-2 against torch SDPA, on one GPU.

Run from the repository root:

    PYTHONPATH=src python3 benchmarks/flash_tune.py [--quick] [--budget-s 480] [--out DIR]

1. correctness: O, L, dQ, dK, dV of the Triton kernels against a float64 reference, bf16 and
   fp32, causal and not, odd sizes, n_queries != n_keys, strided inputs, expanded dO, both dQ
   modes; each error beside PyTorch's own naive same-dtype error (pass: ours <= 2x theirs).
2. the reference workload: batch 1, 16 heads, seq 16384, head dim 64, bf16, causal,
   forward+backward (gradients accumulate into .grad as in training), do_bench median, for
   flash-triton (both dQ modes) and the SDPA backends flash, cudnn, efficient.
3. sweep: fwd-only and bwd-only TFLOP/s, d in {64, 128}, seq 1k..16k (batch*seq = 16k tokens,
   16 heads), causal and not, flash-triton vs sdpa-flash and sdpa-cudnn.

Writes flash_tune.json under --out (default $OUT, else runs/flash_tune) and prints a short
table last. FLOPs: forward 4*B*H*Nq*Nk*d (halved when causal), backward 2.5x forward.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

try:  # run from the repo root without installing
    import lmscope  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from lmscope.kernels import flash_attention as fa  # noqa: E402
from lmscope.kernels.attention_reference import attention_naive, reference_with_grads  # noqa: E402
from lmscope.kernels.flash_attention import triton_kernels as fa_kernels  # noqa: E402
from lmscope.kernels.flash_attention import tuning as fa_tuning  # noqa: E402
from lmscope.records.results import provenance  # noqa: E402
from lmscope.records.stats import ratio_interval  # noqa: E402
from lmscope.workloads.attention import kept_times  # noqa: E402

T0 = time.time()

# (head dim, dtype, causal, dQ mode) combinations this script runs: their kernels are compiled
# up front by parallel worker processes (one autotune config each) into Triton's disk cache, so
# the autotuner in the main process loads binaries instead of compiling ~150 kernels in a row.
WARM_SPECS = [
    (64, "bfloat16", True, "separate"),
    (64, "bfloat16", False, "separate"),
    (64, "bfloat16", True, "atomic"),
    (128, "bfloat16", True, "separate"),
    (128, "bfloat16", False, "separate"),
    (128, "bfloat16", False, "atomic"),
    (32, "float16", True, "separate"),
    (16, "bfloat16", False, "separate"),
    (96, "bfloat16", True, "separate"),
]
WARM_SPECS_FP32 = [
    (64, "float32", True, "separate"),
    (64, "float32", False, "separate"),
    (128, "float32", True, "separate"),
    (80, "float32", False, "separate"),
]

def n_configs(d: int, dtype: str) -> int:
    """How many autotune configs flash_attention/tuning.py lists for this head dim and dtype."""
    if dtype == "float32":
        return 1
    group = "small" if d <= 64 else "large"
    return max(len(fa_tuning._FWD[group]), len(fa_tuning._DKDV[group]), len(fa_tuning._DQ[group]))


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


# ------------------------------------------------------------------------------- correctness


SMOKE = False  # --smoke: tiny shapes on the CPU under TRITON_INTERPRET=1, wall-clock timing


def device() -> str:
    return "cpu" if SMOKE else "cuda"


def sync() -> None:
    if not SMOKE:
        torch.cuda.synchronize()


def check_case(b, h, nq, nk, d, dtype, causal, dq_mode, layout="bhtd", do_kind="randn"):
    dev = device()

    def make(n):
        if layout == "bthd":  # (B, T, H, d) storage read through a transposed view
            return torch.randn(b, n, h, d, device=dev, dtype=dtype).transpose(1, 2)
        return torch.randn(b, h, n, d, device=dev, dtype=dtype)

    q, k, v = make(nq), make(nk), make(nk)
    q.requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    if do_kind == "sum":  # gradient of o.sum(): an expanded, stride-0 tensor
        do = torch.ones(1, device=dev, dtype=dtype).expand(b, h, nq, d)
    else:
        do = torch.randn(b, h, nq, d, device=dev, dtype=dtype)
    ro, rl, *rg = reference_with_grads(q, k, v, do, causal)
    # PyTorch's own naive computation in the same dtype: the tolerance yardstick.
    no = attention_naive(q, k, v, causal)
    ng = torch.autograd.grad(no, (q, k, v), do)

    old = fa.DQ_MODE
    fa.DQ_MODE = dq_mode
    try:
        o = fa.flash_attention(q, k, v, causal)
        lse = o.grad_fn.saved_tensors[4]
        g = torch.autograd.grad(o, (q, k, v), do)
    finally:
        fa.DQ_MODE = old
    sync()
    names = ["o", "dq", "dk", "dv"]
    ours = [rel(o, ro)] + [rel(a, r) for a, r in zip(g, rg, strict=True)]
    theirs = [rel(no, ro)] + [rel(a, r) for a, r in zip(ng, rg, strict=True)]
    lse_err = (lse.double() - rl).abs().max().item()
    ok = all(a <= 2 * t for a, t in zip(ours, theirs, strict=True)) and lse_err < 1e-4
    ok = ok and lse.dtype == torch.float32 and tuple(lse.shape) == (b, h, nq)
    row = {
        "case": f"{b}x{h} q{nq} k{nk} d{d} {str(dtype)[6:]} causal={int(causal)} "
        f"dq={dq_mode} {layout} dO={do_kind}",
        "ok": bool(ok),
        "lse_max_abs": lse_err,
    }
    for n, a, t in zip(names, ours, theirs, strict=True):
        row[f"{n}_rel"] = a
        row[f"{n}_rel_torch"] = t
    return row


def correctness(quick: bool) -> list[dict]:
    cases = [
        # (b, h, nq, nk, d, dtype, causal, dq_mode, layout, do_kind)
        (2, 4, 1000, 1000, 64, torch.bfloat16, True, "separate", "bhtd", "randn"),
        (2, 4, 1000, 1000, 64, torch.bfloat16, False, "separate", "bhtd", "randn"),
        (2, 4, 1000, 1000, 64, torch.float32, True, "separate", "bhtd", "randn"),
        (2, 4, 1000, 1000, 64, torch.bfloat16, True, "atomic", "bhtd", "randn"),
        (1, 3, 333, 517, 64, torch.bfloat16, True, "separate", "bthd", "sum"),
        (1, 3, 517, 333, 128, torch.bfloat16, True, "separate", "bhtd", "randn"),
        (1, 3, 517, 333, 128, torch.bfloat16, False, "atomic", "bhtd", "randn"),
        (2, 2, 77, 1029, 32, torch.float16, True, "separate", "bhtd", "randn"),
        (2, 2, 300, 300, 16, torch.bfloat16, False, "separate", "bhtd", "randn"),
        (1, 2, 200, 211, 96, torch.bfloat16, True, "separate", "bhtd", "randn"),
        (1, 2, 200, 211, 80, torch.float32, False, "separate", "bhtd", "randn"),
        (1, 4, 4096, 4096, 128, torch.bfloat16, True, "separate", "bhtd", "randn"),
        (1, 4, 4096, 4096, 128, torch.bfloat16, False, "separate", "bhtd", "randn"),
        (1, 4, 4096, 4096, 128, torch.float32, True, "separate", "bhtd", "randn"),
    ]
    if quick:  # --quick shortens only the sweep; all correctness cases always run
        pass
    if SMOKE:
        cases = [(1, 2, 37, 29, 16, torch.float32, True, "separate", "bthd", "sum"),
                 (1, 2, 29, 37, 32, torch.bfloat16, False, "atomic", "bhtd", "randn")]  # fmt: skip
    rows = []
    for c in cases:
        try:
            r = check_case(*c)
        except Exception as e:  # keep going: a failure is a row
            r = {"case": str(c), "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
        rows.append(r)
        if "error" in r:
            log(f"{'FAIL':4s} {r['case']}: {r['error']}")
        else:
            log(
                f"{'ok' if r['ok'] else 'FAIL':4s} {r['case']}: "
                + " ".join(
                    f"{n}={r[n + '_rel']:.1e}/{r[n + '_rel_torch']:.1e}"
                    for n in ("o", "dq", "dk", "dv")
                )
                + f" lse={r['lse_max_abs']:.1e}"
            )
    return rows


# ------------------------------------------------------------------------------------ timing


def sdpa_fn(backend_name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[backend_name]

    def fn(q, k, v, causal):
        with sdpa_kernel([backend]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def triton_fn(dq_mode: str):
    def fn(q, k, v, causal):
        fa.DQ_MODE = dq_mode
        return fa.flash_attention(q, k, v, causal)

    return fn


IMPLS = {
    "flash-triton": triton_fn("separate"),
    "flash-triton-atomic": triton_fn("atomic"),
    "sdpa-flash": sdpa_fn("flash"),
    "sdpa-cudnn": sdpa_fn("cudnn"),
    "sdpa-efficient": sdpa_fn("efficient"),
}


def fwd_flops(b, h, nq, nk, d, causal):
    return 4.0 * b * h * nq * nk * d * (0.5 if causal else 1.0)


def bench(fn, rep_ms):
    """Every call's time in ms (do_bench's runs; one timed call in the CPU smoke run)."""
    if SMOKE:
        t = time.perf_counter()
        fn()
        return [(time.perf_counter() - t) * 1e3]
    import triton

    times = triton.testing.do_bench(fn, warmup=max(10, rep_ms // 4), rep=rep_ms, return_mode="all")
    return [float(t) for t in times]  # a list or a tensor, by triton version


def quantiles(times):
    """(p50, p20, p80) of per-call times, linear interpolation as do_bench's quantiles."""
    p50, p20, p80 = np.percentile(times, [50, 20, 80])
    return float(p50), float(p20), float(p80)


def time_impl(name, b, h, n, d, causal, what, rep_ms=200):
    """what: 'fwdbwd' (training step, grads accumulate), 'fwd', 'bwd'. Returns per-call times."""
    fn = IMPLS[name]
    dtype = torch.bfloat16
    q, k, v = (torch.randn(b, h, n, d, device=device(), dtype=dtype) for _ in range(3))
    do = torch.randn(b, h, n, d, device=device(), dtype=dtype)
    if what == "fwd":
        with torch.no_grad():

            def step():
                fn(q, k, v, causal)

            step()
            step()
            return bench(step, rep_ms)
    for t in (q, k, v):
        t.requires_grad_(True)
    if what == "fwdbwd":

        def step():
            fn(q, k, v, causal).backward(do)

        step()
        step()
        return bench(step, rep_ms)
    o = fn(q, k, v, causal)

    def step():
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    step()
    step()
    return bench(step, rep_ms)


def best_configs() -> dict:
    out = {}
    for name in ("_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq"):
        kern = getattr(fa, name)
        cfg = getattr(kern, "best_config", None)
        if cfg is not None:
            out[name] = {**cfg.kwargs, "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        timings = getattr(kern, "configs_timings", None)
        if timings:
            out[name + "_timings"] = {
                f"{c.kwargs} w{c.num_warps} s{c.num_stages}": t[0] if isinstance(t, list) else t
                for c, t in timings.items()
            }
    return out


def reference_workload(rep_ms: int, impls: list[str] | None = None) -> tuple[list[dict], dict]:
    b, h, n, d, causal = (1, 2, 40, 16, True) if SMOKE else (1, 16, 16384, 64, True)
    flops = 3.5 * fwd_flops(b, h, n, n, d, causal)
    rows, tuned = [], {}
    for name in impls or list(IMPLS):
        try:
            times = time_impl(name, b, h, n, d, causal, "fwdbwd", rep_ms)
            p50, p20, p80 = quantiles(times)
            row = {"impl": name, "ms": p50, "ms_p20": p20, "ms_p80": p80,
                   "tflops": flops / p50 / 1e9, "status": "ok", "times_ms": kept_times(times)}  # fmt: skip
            if name.startswith("flash-triton"):
                tuned[name] = best_configs()
        except Exception as e:
            row = {"impl": name, "status": "error", "error": f"{type(e).__name__}: {e}"[:300]}
        rows.append(row)
        log(f"ref workload {name}: {row.get('ms', float('nan')):.3f} ms {row.get('error', '')}")
        if not SMOKE:
            torch.cuda.empty_cache()
    fa.DQ_MODE = "separate"
    return rows, tuned


def sweep(quick: bool, deadline: float, rep_ms: int) -> list[dict]:
    rows = []
    seqs = [1024, 4096, 16384] if quick else [1024, 2048, 4096, 8192, 16384]
    impls = ["flash-triton", "sdpa-flash", "sdpa-cudnn"]
    if SMOKE:
        seqs, impls = [1024], ["flash-triton"]
    for d in (16,) if SMOKE else (64, 128):
        for causal in (True, False):
            for n in seqs:
                b, h = (1, 1) if SMOKE else (max(1, 16384 // n), 16)
                n = 24 if SMOKE else n
                for what in ("fwd", "bwd"):
                    f = fwd_flops(b, h, n, n, d, causal) * (2.5 if what == "bwd" else 1.0)
                    for name in impls:
                        if time.time() > deadline:
                            log("sweep: time budget spent, stopping")
                            return rows
                        try:
                            p50, _, _ = quantiles(time_impl(name, b, h, n, d, causal, what, rep_ms))
                            r = {"impl": name, "d": d, "causal": causal, "seq": n, "batch": b,
                                 "heads": h, "pass": what, "ms": p50, "tflops": f / p50 / 1e9}  # fmt: skip
                            if name == "flash-triton":
                                r["configs"] = {k: v for k, v in best_configs().items()
                                                if "timings" not in k}  # fmt: skip
                        except Exception as e:
                            r = {"impl": name, "d": d, "causal": causal, "seq": n, "pass": what,
                                 "error": f"{type(e).__name__}: {e}"[:200]}  # fmt: skip
                        rows.append(r)
                log(f"sweep d={d} causal={int(causal)} seq={n} done")
    return rows


def warm_worker(specs: list) -> None:
    """Run fwd+bwd once per spec at a small shape (compiles; LMSCOPE_FLASH_ONLY_CONFIG pins)."""
    for d, dtype, causal, mode in specs:
        t = time.time()
        q, k, v = (torch.randn(1, 2, 200, d, device="cuda", dtype=getattr(torch, dtype),
                               requires_grad=True) for _ in range(3))  # fmt: skip
        fa.DQ_MODE = mode
        fa.flash_attention(q, k, v, causal).sum().backward()
        torch.cuda.synchronize()
        print(f"warm cfg={os.environ.get('LMSCOPE_FLASH_ONLY_CONFIG')} d={d} {dtype} "
              f"causal={int(causal)} {mode}: {time.time() - t:.1f}s", flush=True)  # fmt: skip


def warm_cache(timeout_s: float) -> None:
    """Compile every (spec, config) in parallel subprocesses; waits at most timeout_s."""
    import subprocess

    jobs = []
    specs = WARM_SPECS + WARM_SPECS_FP32
    for idx in range(max(n_configs(s[0], s[1]) for s in specs)):
        todo = [s for s in specs if idx < n_configs(s[0], s[1])]
        for i in range(3):
            if todo[i::3]:
                jobs.append((idx, todo[i::3]))
    procs = []
    for idx, chunk in jobs:
        env = dict(os.environ, LMSCOPE_FLASH_ONLY_CONFIG=str(idx), PYTHONUNBUFFERED="1")
        cmd = [sys.executable, os.path.abspath(__file__), "--warm-worker", json.dumps(chunk)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    deadline = time.time() + timeout_s
    n_ok = 0
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
            n_ok += p.returncode == 0
            if p.returncode != 0:
                log(f"warm worker failed (rc {p.returncode}): {out[-1500:]}")
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            log("warm worker timed out")
    log(f"warm-up: {n_ok}/{len(procs)} workers ok")


def _forget_tuning() -> None:
    """Clear the autotuners' choices (the launchers, and the C++ host path's plans with them,
    learn again on the next call)."""
    for kern in (fa_kernels._attn_fwd, fa_kernels._attn_bwd_dkdv, fa_kernels._attn_bwd_dq):
        kern.cache.clear()


def validate_configs() -> list[dict]:
    """Check every 16-bit config of every autotuned kernel (bf16, d 64 and 128, causal and not)
    one by one."""
    rows = []
    for d in (16,) if SMOKE else (64, 128):
        rows += _validate_group(d)
    fa_tuning._ONLY_CONFIG = None
    _forget_tuning()
    log(f"validated configs one by one: {sum(r['ok'] for r in rows)}/{len(rows)} ok")
    return rows


def _validate_group(d: int) -> list[dict]:
    rows = []
    n = 1 if SMOKE else n_configs(d, "bfloat16")
    shape = (1, 2, 40, 40, 16) if SMOKE else (1, 4, 1000, 1000, d)
    for idx in range(n):
        fa_tuning._ONLY_CONFIG = idx
        _forget_tuning()
        for causal in (True, False):
            r = check_case(*shape, torch.bfloat16, causal, "separate")
            r["config_index"] = idx
            r["configs"] = {k: v for k, v in best_configs().items() if "timings" not in k}
            rows.append(r)
            if not r["ok"]:
                log(f"config {idx} d={d} causal={int(causal)} FAILED: {r}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer seq lens in the sweep")
    ap.add_argument("--budget-s", type=float, default=480.0, help="stop the sweep after this")
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench rep (ms) per timing")
    ap.add_argument("--skip", default="", help="comma list of: warm,correct,ref,sweep")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join("runs", "flash_tune"))
    ap.add_argument("--warm-s", type=float, default=240.0, help="parallel compile time limit")
    ap.add_argument("--warm-worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--validate-configs", action="store_true",
                    help="check each d<=64 config separately (with LMSCOPE_FLASH_WIDE=1: all)")  # fmt: skip
    ap.add_argument("--impls", default="flash-triton,sdpa-flash,sdpa-cudnn,sdpa-efficient",
                    help="implementations timed at the reference workload")  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="CPU check of this script itself; "
                    "needs TRITON_INTERPRET=1 in the environment")  # fmt: skip
    args = ap.parse_args()
    global SMOKE
    SMOKE = args.smoke
    if SMOKE:
        args.skip += ",warm"
    if args.warm_worker is not None:
        warm_worker(json.loads(args.warm_worker))
        return
    skip = set(filter(None, args.skip.split(",")))
    if not torch.cuda.is_available() and not SMOKE:
        sys.exit("flash_tune.py needs a CUDA device")

    prov = {
        **provenance(),
        "wide_lists": bool(os.environ.get("LMSCOPE_FLASH_WIDE")),
        "device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(),
        "argv": sys.argv,
    }
    log(f"{prov['device']} torch {prov['torch']} triton {prov['triton']} cuda {prov['cuda']}")
    result: dict = {"provenance": prov}
    deadline = T0 + args.budget_s
    os.makedirs(args.out, exist_ok=True)
    if "warm" not in skip:
        warm_cache(args.warm_s)

    if "correct" not in skip:
        result["correctness"] = correctness(args.quick)
    if args.validate_configs:
        result["validate_configs"] = validate_configs()
    if "ref" not in skip:
        impls = args.impls.split(",")
        result["reference"], result["tuned"] = reference_workload(args.rep_ms, impls)
        for impl, cfgs in result["tuned"].items():
            for k, v in cfgs.items():
                if "timings" in k:
                    best = sorted(v.items(), key=lambda kv: kv[1])
                    log(f"{impl} {k}: " + ", ".join(f"{c}={t:.3f}" for c, t in best))
                else:
                    log(f"{impl} {k}: {v}")
    if "sweep" not in skip:
        result["sweep"] = sweep(args.quick, deadline, args.rep_ms // 2)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "flash_tune.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)

    # ---- short tables last
    if "sweep" in result:
        print("\nsweep (TFLOP/s, bf16; fwd | bwd):")
        key = {}
        for r in result["sweep"]:
            if "tflops" in r:
                key[(r["d"], r["causal"], r["seq"], r["pass"], r["impl"])] = r["tflops"]
        impls = ["flash-triton", "sdpa-flash", "sdpa-cudnn"]
        print(f"{'d':>4} {'causal':>6} {'seq':>6} | " + " ".join(f"{i[:12]:>12}" for i in impls)
              + " | " + " ".join(f"{i[:12]:>12}" for i in impls))  # fmt: skip
        for d in (64, 128):
            for causal in (True, False):
                for n in (1024, 2048, 4096, 8192, 16384):
                    vals = [key.get((d, causal, n, p, i)) for p in ("fwd", "bwd") for i in impls]
                    if all(x is None for x in vals):
                        continue
                    cells = [f"{x:12.0f}" if x else f"{'-':>12}" for x in vals]
                    print(f"{d:>4} {int(causal):>6} {n:>6} | " + " ".join(cells[:3]) + " | "
                          + " ".join(cells[3:]))  # fmt: skip
    if "correctness" in result:
        bad = [r["case"] for r in result["correctness"] if not r["ok"]]
        print(f"\ncorrectness: {len(result['correctness']) - len(bad)}/"
              f"{len(result['correctness'])} ok" + (f"; FAILED: {bad}" if bad else ""))  # fmt: skip
    if "reference" in result:
        ref = {r["impl"]: r for r in result["reference"]}
        print("\nreference workload: B=1 H=16 T=16384 d=64 bf16 causal, fwd+bwd, do_bench median")
        print(f"{'impl':<22} {'ms':>8} {'p20':>8} {'p80':>8} {'TFLOP/s':>8}")
        for name, r in ref.items():
            if r["status"] == "ok":
                print(f"{name:<22} {r['ms']:8.3f} {r['ms_p20']:8.3f} {r['ms_p80']:8.3f} "
                      f"{r['tflops']:8.0f}")  # fmt: skip
            else:
                print(f"{name:<22} error: {r['error'][:80]}")
        ours = ref.get("flash-triton", {}).get("times_ms")
        for peer in ("sdpa-flash", "sdpa-cudnn"):
            theirs = ref.get(peer, {}).get("times_ms")
            if ours and theirs:
                print(f"speedup flash-triton vs {peer}: {ratio_interval(theirs, ours).as_text()} "
                      "(median ratio, 95 % bootstrap interval)")
    print(f"\ntotal {time.time() - T0:.0f}s; json in {args.out}")


if __name__ == "__main__":
    main()
