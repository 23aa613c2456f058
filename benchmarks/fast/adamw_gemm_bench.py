"""Kernel benchmark: AdamW fused into the weight-gradient GEMM vs cuBLAS GEMM + FusedAdamW.

For the four block matmuls of a preset (default xl, batch 4 x context 512 tokens), times on the
GPU: the fp32-output cuBLAS GEMM (what ``master_linear`` runs), FusedAdamW's per-weight update
kernel, their sum, and ``adamw_gemm_step`` (autotuned, and each config pinned), after checking
that both paths give the same parameters. Prints a table; writes JSON lines to --out.

    PYTHONPATH=src python3 benchmarks/fast/adamw_gemm_bench.py --size xl --out $OUT/adamw_gemm.jsonl
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.testing

from lmscope.config import preset
from lmscope.kernels import adamw, adamw_gemm

SETTINGS = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def _segments(rows: list[int], n: int) -> list[adamw_gemm.Segment]:
    return [adamw_gemm.Segment(torch.randn(r, n, device="cuda"), torch.zeros(r, n, device="cuda"),
                               torch.zeros(r, n, device="cuda"), torch.zeros((), device="cuda"),
                               torch.empty(r, n, dtype=torch.bfloat16, device="cuda")) for r in rows]


def _separate(grad_out: torch.Tensor, x: torch.Tensor, segments, update: bool = True):
    """cuBLAS fp32-output GEMM of the stack, then one FusedAdamW kernel per weight."""
    dw = torch.mm(grad_out.t(), x, out_dtype=torch.float32)
    if not update:
        return
    for seg, g in zip(segments, dw.split([s.param.shape[0] for s in segments]), strict=True):
        n = seg.param.numel()
        adamw._adamw_kernel[(triton.cdiv(n, adamw._BLOCK),)](
            seg.param, g, seg.exp_avg, seg.exp_avg_sq, seg.shadow, seg.step, n, 1.0, SETTINGS["lr"],
            *SETTINGS["betas"], SETTINGS["eps"], SETTINGS["weight_decay"],
            HAS_SHADOW=True, BLOCK=adamw._BLOCK, num_warps=8)  # fmt: skip


def _copy(segments):
    return [adamw_gemm.Segment(*(t.clone() for t in (s.param, s.exp_avg, s.exp_avg_sq, s.step, s.shadow)))
            for s in segments]


def _ms(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=60)


def _label(pinned: dict) -> str:
    return "{BLOCK_M}x{BLOCK_N}x{BLOCK_K}/s{EPILOGUE_SPLIT}/w{num_warps}/st{num_stages}".format(**pinned)


def measure(size: str, name: str, rows: list[int], n: int, t: int) -> dict:
    """One matmul's row: check both paths agree, then time them (and each pinned config)."""
    grad_out = torch.randn(t, sum(rows), device="cuda", dtype=torch.bfloat16)
    x = torch.randn(t, n, device="cuda", dtype=torch.bfloat16)
    adamw_gemm.adamw_gemm_step(grad_out, x, _segments(rows, n), step_offset=1.0, **SETTINGS)  # tunes
    fused = _segments(rows, n)  # one step from the same state on both paths
    separate = _copy(fused)
    adamw_gemm.adamw_gemm_step(grad_out, x, fused, step_offset=1.0, **SETTINGS)
    _separate(grad_out, x, separate)
    err = max(((a.param - b.param).abs().max() / b.param.abs().max()).item()
              for a, b in zip(fused, separate, strict=True))
    gemm_ms = _ms(lambda: _separate(grad_out, x, separate, update=False))
    both_ms = _ms(lambda: _separate(grad_out, x, separate))
    fused_ms = _ms(lambda: adamw_gemm.adamw_gemm_step(grad_out, x, fused, step_offset=1.0, **SETTINGS))
    best = str(adamw_gemm._adamw_gemm_kernel.best_config)
    per_config = {}
    for c in adamw_gemm._CONFIGS:
        pinned = dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)
        try:
            per_config[_label(pinned)] = _ms(lambda p=pinned: adamw_gemm.adamw_gemm_step(
                grad_out, x, fused, step_offset=1.0, config=p, **SETTINGS))
        except Exception as exc:  # noqa: BLE001 - out of resources: recorded, the rest go on
            per_config[_label(pinned)] = type(exc).__name__
    flop = 2 * t * sum(rows) * n
    return dict(size=size, matmul=name, tokens=t, rows=rows, n=n, params=sum(rows) * n,
                gemm_ms=gemm_ms, gemm_plus_adamw_ms=both_ms, fused_ms=fused_ms,
                speedup=both_ms / fused_ms, gemm_tflops=flop / gemm_ms / 1e9, fused_best_config=best,
                per_config_ms=per_config, max_rel_param_diff=err, device=torch.cuda.get_device_name(),
                torch=torch.__version__, triton=triton.__version__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="xl")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cfg = preset(args.size)
    d, f = cfg.d_model, cfg.d_ff
    shapes = {"qkv": ([d, d, d], d), "out": ([d], d), "w13": ([f, f], d), "w2": ([d], f)}
    rows_out = []
    for name, (rows, n) in shapes.items():
        rows_out.append(measure(args.size, name, rows, n, args.tokens))
        print(json.dumps(rows_out[-1]), flush=True)
    print("\n| matmul | cuBLAS GEMM ms | GEMM + FusedAdamW ms | fused ms | speedup | max rel diff |")
    print("|---|---|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['matmul']} | {r['gemm_ms']:.3f} | {r['gemm_plus_adamw_ms']:.3f} | {r['fused_ms']:.3f} "
              f"| {r['speedup']:.2f}x | {r['max_rel_param_diff']:.1e} |")
    if args.out:
        with open(args.out, "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows_out)


if __name__ == "__main__":
    main()
