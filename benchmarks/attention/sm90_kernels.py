"""The Gluon sm_90 kernels (``lmscope.kernels.flash_sm90``, ``flash_sm90_dkdv``) against the
Triton kernels and cuDNN: correctness against a float64 reference, then times. GPU only
(H100/H200); a development tool, the committed comparisons are ``lmscope attention`` rows.

    PYTHONPATH=src python3 benchmarks/attention/sm90_kernels.py [--out DIR] [--skip-times]

Writes ``sm90_check.jsonl`` (one row per correctness case: errors of O, L, dQ, dK, dV beside
torch's same-dtype error) and ``sm90_times.jsonl`` (forward and forward+backward medians per
shape and mode) under --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch
import triton

try:
    import lmscope  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

from lmscope.kernels import flash_attention as fa  # noqa: E402
from lmscope.kernels import flash_sm90, flash_sm90_dkdv, flash_sm90_dq  # noqa: E402
from lmscope.kernels.attention_reference import (  # noqa: E402
    attention_naive,
    reference_with_grads,
    relative_error,
)
from lmscope.kernels.flash_attention import plan as fa_plan  # noqa: E402

CASES = [  # (B, H, n_q, n_k, d, causal, token_major)
    (1, 2, 256, 256, 64, True, False),
    (2, 3, 1000, 1000, 128, True, False),
    (2, 3, 1000, 1000, 128, True, True),
    (1, 4, 777, 777, 64, False, True),
    (1, 2, 300, 700, 128, True, False),
    (1, 2, 700, 300, 64, True, False),
    (1, 2, 300, 700, 128, False, False),
    (1, 1, 64, 64, 128, True, False),
    (1, 2, 1200, 1200, 64, True, True),
]
SHAPES = [(1, 16, 16384, 64), (1, 16, 8192, 128), (1, 16, 32768, 128)]
MODES = {  # Gluon forward, dK/dV, dQ
    "triton": (False, False, False),
    "gluon-fwd": (True, False, False),
    "gluon-fwd-dkdv": (True, True, False),
    "gluon-all": (True, True, True),
}


CALLS = {"gluon_fwd": 0, "gluon_dkdv": 0, "gluon_dq": 0}


def _counted(module, name: str, key: str) -> None:
    real = getattr(module, name)

    def counted(*args, **kwargs):
        CALLS[key] += 1
        return real(*args, **kwargs)

    setattr(module, name, counted)


_counted(flash_sm90, "forward", "gluon_fwd")
_counted(flash_sm90_dkdv, "dkdv", "gluon_dkdv")
_counted(flash_sm90_dq, "dq", "gluon_dq")


def attention(q, k, v, causal):
    """The autograd Function itself: the C++ host path, which keeps the plans of its first
    mode, stays out of the comparison."""
    return fa.FlashAttentionTriton.apply(q, k, v, causal)


def set_mode(name: str) -> None:
    flash_sm90.ENABLED, flash_sm90_dkdv.ENABLED, flash_sm90_dq.ENABLED = MODES[name]
    flash_sm90.MIN_WORK = 1
    fa_plan._PLANS.clear()


def _inputs(b, h, n_q, n_k, d, token_major, dtype=torch.bfloat16):
    def one(n):
        if token_major:
            return torch.randn(b, n, h, d, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(b, h, n, d, device="cuda", dtype=dtype)

    return one(n_q), one(n_k), one(n_k)


def check(rows: list, modes=tuple(MODES)) -> None:
    for case in CASES:
        b, h, n_q, n_k, d, causal, tm = case
        torch.manual_seed(len(rows))
        q, k, v = _inputs(b, h, n_q, n_k, d, tm)
        do = torch.randn_like(q)
        ref_o, ref_l, *ref_g = reference_with_grads(q, k, v, do, causal)
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        naive_o = attention_naive(*leaves, causal)
        naive = (naive_o, *torch.autograd.grad(naive_o, leaves, do))
        visible = ref_l.isfinite()
        for mode in modes:
            set_mode(mode)
            leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
            before = dict(CALLS)
            o = attention(*leaves, causal)
            o.backward(do)
            ours = (o, *(t.grad for t in leaves))
            row = dict(case=list(case), mode=mode, **{k: CALLS[k] - before[k] for k in CALLS})
            ok = True
            refs = (ref_o, *ref_g)
            for name, x, theirs, ref in zip(("O", "dQ", "dK", "dV"), ours, naive, refs, strict=True):
                sel = visible if name in ("O", "dQ") else slice(None)
                err, tol = relative_error(x[sel], ref[sel]), 2 * relative_error(theirs[sel], ref[sel])
                row[name] = [err, tol]
                ok = ok and err <= tol
            row["ok"] = ok
            rows.append(row)
            print(row, flush=True)


def _median(fn) -> list[float]:
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=50, rep=400, quantiles=[0.5, 0.2, 0.8])


def times(rows: list) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for b, h, n, d in SHAPES:
        q, k, v = _inputs(b, h, n, n, d, True)
        do = torch.randn_like(q)
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

        def ours(leaves=leaves):
            return attention(*leaves, True)

        def cudnn(leaves=leaves):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)

        for mode in [*MODES, "sdpa-cudnn"]:
            fn = cudnn if mode == "sdpa-cudnn" else ours
            if mode != "sdpa-cudnn":
                set_mode(mode)
            with torch.no_grad():
                fwd = _median(fn)
            both = _median(lambda fn=fn, do=do: torch.autograd.backward(fn(), do))
            flops = 4 * b * h * n * n * d / 2
            row = dict(shape=[b, h, n, d], mode=mode, fwd_ms=fwd[0], fwd_p20=fwd[1], fwd_p80=fwd[2],
                       fwd_bwd_ms=both[0], fwd_bwd_p20=both[1], fwd_bwd_p80=both[2],
                       fwd_tflops=flops / fwd[0] / 1e9, device=torch.cuda.get_device_name())  # fmt: skip
            row.update(CALLS)
            rows.append(row)
            print(row, flush=True)


# Variants of the Gluon kernels, checked and timed (fwd+bwd) in mode gluon-all: the host functions
# read these module attributes at each call.
VARIANTS = {
    "default": {},
    "separate dQ": {(fa, "DQ_MODE"): "separate"},
    "L, D compact at d 64": {(flash_sm90_dkdv, "COMPACT_ROWS"): {64: True, 128: True}},
    "L, D in the columns' layout at d 128": {(flash_sm90_dkdv, "COMPACT_ROWS"): {64: False, 128: False}},
}


@contextlib.contextmanager
def _overridden(overrides: dict):
    """The module attributes of one variant set, restored on exit."""
    saved = {key: getattr(*key) for key in overrides}
    for (module, attr), value in overrides.items():
        setattr(module, attr, value)
    try:
        yield
    finally:
        for (module, attr), value in saved.items():
            setattr(module, attr, value)


def _long_context():
    """Per shape of SHAPES, in mode gluon-all: ((b, h, n, d), leaves q, k, v, dO), causal inputs in
    (B, T, H, d) memory."""
    set_mode("gluon-all")
    for b, h, n, d in SHAPES:
        q, k, v = _inputs(b, h, n, n, d, True)
        yield (b, h, n, d), [t.detach().requires_grad_(True) for t in (q, k, v)], torch.randn_like(q)


def variants(rows: list) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, overrides in VARIANTS.items():  # correctness first: every case, mode gluon-all
        with _overridden(overrides):
            checked: list[dict] = []
            check(checked, modes=["gluon-all"])
        rows.extend(dict(r, variant=name) for r in checked)
    broken = {r["variant"] for r in rows if not r["ok"]}
    for (b, h, n, d), leaves, do in _long_context():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):  # the same call's cuDNN, for scale
            both = _median(lambda x=leaves, g=do: torch.autograd.backward(
                torch.nn.functional.scaled_dot_product_attention(*x, is_causal=True), g))
        rows.append(dict(shape=[b, h, n, d], variant="sdpa-cudnn", fwd_bwd_ms=both[0], fwd_bwd_p20=both[1],
                         fwd_bwd_p80=both[2], status="ok"))  # fmt: skip
        print(rows[-1], flush=True)
        for name, overrides in VARIANTS.items():
            if name in broken:
                continue
            try:
                with _overridden(overrides):
                    both = _median(lambda x=leaves, g=do: torch.autograd.backward(attention(*x, True), g))
                row = dict(shape=[b, h, n, d], variant=name, fwd_bwd_ms=both[0], fwd_bwd_p20=both[1],
                           fwd_bwd_p80=both[2], status="ok")  # fmt: skip
            except Exception as error:  # a variant that does not build or fit: a row, and on
                row = dict(shape=[b, h, n, d], variant=name, status="error", error=repr(error)[:300])
            rows.append(row)
            print(row, flush=True)


def profile(rows: list) -> None:
    """Kernel times of one fwd+bwd per shape and variant that passed its check, in mode gluon-all
    (torch.profiler)."""
    broken = {r["variant"] for r in rows if "ok" in r and not r["ok"]}
    for name, overrides in VARIANTS.items():
        if name not in broken:
            with _overridden(overrides):
                _profile_variant(rows, name)


def _profile_variant(rows: list, variant: str) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for (b, h, n, d), leaves, do in _long_context():
        for _ in range(3):
            torch.autograd.backward(attention(*leaves, True), do)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                torch.autograd.backward(attention(*leaves, True), do)
            torch.cuda.synchronize()
        for event in prof.key_averages():
            if event.device_type.name == "CUDA" or "CUDA" in str(event.device_type):
                ms = getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0)) / 1e3 / 5
                if ms > 0:
                    row = dict(shape=[b, h, n, d], variant=variant, kernel=event.key[:80], ms_per_call=ms)
                    rows.append(row)
                    print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--skip-times", action="store_true")
    parser.add_argument("--variants", action="store_true", help="time the VARIANTS and profile, no check")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.variants:
        found: list[dict] = []
        variants(found)
        profile(found)
        with open(os.path.join(args.out, "sm90_variants.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in found)
        return
    checked: list[dict] = []
    check(checked)
    with open(os.path.join(args.out, "sm90_check.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in checked)
    if args.skip_times or not all(r["ok"] for r in checked):
        return
    timed: list[dict] = []
    times(timed)
    with open(os.path.join(args.out, "sm90_times.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in timed)


if __name__ == "__main__":
    main()
