"""The Gluon sm_90 forward (``lmscope.kernels.flash_sm90``) against the Triton forward and
cuDNN: correctness against a float64 reference, then forward times. GPU only (H100/H200).

    PYTHONPATH=src python3 benchmarks/attention/sm90_forward.py [--out DIR]

Writes ``sm90_forward_check.jsonl`` (one row per correctness case) and
``sm90_forward_times.jsonl`` (one row per shape and implementation) under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import triton

try:
    import lmscope  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

from lmscope.kernels import flash_attention as fa  # noqa: E402
from lmscope.kernels import flash_sm90  # noqa: E402

CASES = [  # (B, H, n_q, n_k, d, causal, token_major)
    (1, 2, 256, 256, 64, True, False),
    (2, 3, 1000, 1000, 128, True, False),
    (2, 3, 1000, 1000, 128, True, True),
    (1, 4, 777, 777, 64, False, True),
    (1, 2, 300, 700, 128, True, False),
    (1, 2, 700, 300, 64, True, False),
    (1, 2, 300, 700, 128, False, False),
    (1, 1, 64, 64, 128, True, False),
]
SHAPES = [(1, 16, 16384, 64), (1, 16, 8192, 128), (1, 16, 32768, 128), (8, 16, 1024, 64)]


def _inputs(b, h, n_q, n_k, d, token_major, dtype=torch.bfloat16):
    def one(n):
        if token_major:
            return torch.randn(b, n, h, d, device="cuda", dtype=dtype).transpose(1, 2)
        return torch.randn(b, h, n, d, device="cuda", dtype=dtype)

    return one(n_q), one(n_k), one(n_k)


def _reference(q, k, v, causal):
    q, k, v = (x.double() for x in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n_q, n_k = s.shape[-2:]
        s = s.masked_fill(torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.softmax(s, -1) @ v, lse


def sm90(q, k, v, causal, **options):
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
    flash_sm90.forward(q, k, v, o, lse, causal, fa.LOG2E / math.sqrt(q.shape[-1]), **options)
    return o, lse


def check(rows):
    for b, h, n_q, n_k, d, causal, tm in CASES:
        torch.manual_seed(len(rows))
        q, k, v = _inputs(b, h, n_q, n_k, d, tm)
        ref_o, ref_lse = _reference(q, k, v, causal)
        o, lse = sm90(q, k, v, causal)
        t_o, _ = fa.flash_attention_forward(q, k, v, causal)
        rows_ok = ref_lse.isfinite()  # rows with no visible key (n_q > n_k, causal) are skipped
        err = (o.double() - ref_o)[rows_ok].abs().max().item()
        lse_err = (lse.double() - ref_lse)[rows_ok].abs().max().item()
        triton_err = (t_o.double() - ref_o)[rows_ok].abs().max().item()
        row = dict(
            case=[b, h, n_q, n_k, d],
            causal=causal,
            token_major=tm,
            o_err=err,
            lse_err=lse_err,
            triton_o_err=triton_err,
            ok=err <= 2 * triton_err + 1e-3 and lse_err < 1e-3,
        )
        rows.append(row)
        print(row, flush=True)


def times(rows):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for b, h, n, d in SHAPES:
        q, k, v = _inputs(b, h, n, n, d, True)

        def cudnn(q=q, k=k, v=v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        impls = {
            "gluon-sm90": lambda q=q, k=k, v=v: sm90(q, k, v, True),
            "gluon-sm90-no-pingpong": lambda q=q, k=k, v=v: sm90(q, k, v, True, pingpong=False),
            "triton": lambda q=q, k=k, v=v: fa.flash_attention_forward(q, k, v, True),
            "sdpa-cudnn": cudnn,
        }
        if d == 128:
            impls["gluon-sm90-3-stages"] = lambda q=q, k=k, v=v: sm90(q, k, v, True, stages=3)
        for name, fn in impls.items():
            fn()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(fn, warmup=50, rep=300, quantiles=[0.5, 0.2, 0.8])
            flops = 4 * b * h * n * n * d / 2
            row = dict(
                shape=[b, h, n, d],
                impl=name,
                fwd_ms=ms[0],
                p20=ms[1],
                p80=ms[2],
                tflops=flops / ms[0] / 1e9,
                device=torch.cuda.get_device_name(),
            )
            rows.append(row)
            print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--skip-times", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    checked: list[dict] = []
    check(checked)
    with open(os.path.join(args.out, "sm90_forward_check.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in checked)
    if args.skip_times or not all(r["ok"] for r in checked):
        return
    timed: list[dict] = []
    times(timed)
    with open(os.path.join(args.out, "sm90_forward_times.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in timed)


if __name__ == "__main__":
    main()
