"""Autotuning of the Triton FlashAttention kernels: the config lists and how one is chosen.

Tile sizes, warps and pipeline stages are autotuned from a small list per head dim (per kernel,
``_FWD``, ``_DKDV``, ``_DQ``), keyed on head dim, causal, dtype and power-of-two buckets of the
sequence lengths (``_TUNE_KEY``); ``_pruner`` keeps the list of the launch's head-dim group and
dtype. Under ``TRITON_INTERPRET=1`` every kernel has one small config.
"""

from __future__ import annotations

import inspect

import torch
import triton

from lmscope.envflags import env_flag

_INTERPRET = env_flag("TRITON_INTERPRET")


# --------------------------------------------------------------------------------------------
# autotuning configs
# --------------------------------------------------------------------------------------------


def _cfg(names: tuple[str, str], t: tuple) -> triton.Config:
    b0, b1, warps, stages, *rest = t
    head_major = bool(rest[0]) if rest else False
    return triton.Config(
        {names[0]: b0, names[1]: b1, "HEAD_MAJOR": head_major}, num_warps=warps, num_stages=stages
    )


def _key(c: triton.Config, names: tuple[str, str]) -> tuple:
    k = (c.kwargs[names[0]], c.kwargs[names[1]], c.num_warps, c.num_stages)
    return (*k, True) if c.kwargs["HEAD_MAJOR"] else k


# (tile0, tile1, num_warps, num_stages[, HEAD_MAJOR]) per kernel; "small" for head dims <= 64,
# "large" above; fp32 gets one config (IEEE dots run on the FMA units: correctness, not speed).
# Picked from register/spill reports of sm_90 builds (4-warp variants of the larger tiles spill)
# and from timings on an H100 (docs/kernels/flash_attention.md). A fifth entry True means
# HEAD_MAJOR grid order: batch*heads on grid axis 0, so every head's heavy tiles start first.
_FWD = {
    "small": [(128, 64, 8, 3, True), (64, 64, 4, 3, True), (64, 64, 4, 3), (128, 64, 8, 3)],
    "large": [(128, 64, 8, 3), (128, 64, 8, 3, True), (128, 64, 8, 2), (64, 64, 4, 3),
              (64, 64, 4, 3, True), (128, 128, 8, 2)],  # fmt: skip
    "fp32": [(32, 32, 4, 2)],
    "interp": [(16, 16, 1, 1, True)],
}
_DKDV = {  # (BLOCK_M1 queries per step, BLOCK_N1 resident keys)
    "small": [(64, 64, 4, 3), (64, 64, 4, 3, True), (32, 128, 4, 5), (64, 128, 8, 3)],
    "large": [(32, 128, 8, 3), (32, 128, 8, 2), (16, 128, 8, 3), (64, 128, 8, 2),
              (32, 64, 4, 3), (64, 128, 8, 3)],  # the last two: the wide lists' d 128 picks
    "fp32": [(16, 64, 8, 2)],
    "interp": [(16, 32, 1, 1)],
}
_DQ = {  # (BLOCK_M2 resident queries, BLOCK_N2 keys per step)
    "small": [(64, 64, 4, 3, True), (64, 128, 4, 3), (64, 64, 4, 3), (128, 32, 4, 5)],
    "large": [(128, 32, 8, 3), (128, 32, 8, 3, True), (128, 64, 8, 2), (64, 32, 4, 3),
              (64, 32, 4, 3, True), (128, 16, 8, 3), (128, 64, 8, 3)],  # fmt: skip
    "fp32": [(32, 16, 4, 2)],
    "interp": [(32, 16, 1, 1, True)],
}
# LMSCOPE_FLASH_WIDE=1: the longer head-dim <= 64 lists the lists above were chosen from
# (the tuning script at e124d15:benchmarks/flash_tune.py ran with it; numbers in
# docs/kernels/flash_attention.md), and longer
# head-dim > 64 backward lists with larger query and key tiles, measured at d 128 where the
# backward trails cuDNN (docs/kernels/flash_attention_backward_notes.md).
if env_flag("LMSCOPE_FLASH_WIDE"):
    _DKDV["large"] = [*_DKDV["large"], (64, 64, 4, 3), (64, 64, 4, 2), (32, 128, 4, 3),
                      (64, 64, 8, 3), (32, 128, 8, 4)]  # fmt: skip
    _DQ["large"] = [*_DQ["large"], (64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 8, 2), (128, 128, 8, 2),
                    (64, 64, 8, 3), (128, 32, 8, 4)]  # fmt: skip
    _FWD["small"] = [(128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 8, 2), (64, 64, 4, 3),
                     (64, 128, 4, 3), (128, 32, 8, 3), (64, 64, 4, 4), (128, 64, 4, 4),
                     (128, 64, 8, 3, True), (64, 64, 4, 3, True)]  # fmt: skip
    _DKDV["small"] = [(32, 128, 4, 5), (64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2),
                      (32, 64, 4, 3), (32, 64, 4, 4), (64, 128, 8, 4), (32, 128, 4, 4),
                      (32, 128, 4, 5, True), (64, 64, 4, 3, True)]  # fmt: skip
    _DQ["small"] = [(64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 2), (64, 32, 4, 3),
                    (64, 32, 4, 4), (64, 128, 4, 3), (128, 64, 8, 4), (32, 64, 4, 3),
                    (64, 64, 4, 3, True), (128, 64, 8, 3, True)]  # fmt: skip


def _configs(table: dict, names: tuple[str, str]) -> list[triton.Config]:
    if _INTERPRET:
        return [_cfg(names, t) for t in table["interp"]]
    seen: list[tuple] = []
    for group in ("small", "large", "fp32"):
        for t in table[group]:
            if t not in seen:
                seen.append(t)
    return [_cfg(names, t) for t in seen]


def _pruner(table: dict, names: tuple[str, str]):
    """Keep the configs listed for this launch's head dim and dtype."""

    def prune(configs, named_args, **kwargs):
        if _INTERPRET:
            return configs
        args = {**named_args, **kwargs}
        head_dim = int(args["HEAD_DIM"])
        is_fp32 = args["Q"].dtype == torch.float32
        group = "fp32" if is_fp32 else ("small" if head_dim <= 64 else "large")
        wanted = set(table[group])
        kept = [c for c in configs if _key(c, names) in wanted]
        q = args["Q"]
        if q.shape[0] * q.shape[1] > 65535:  # batch*heads must go on grid axis 0
            kept = [c for c in kept if c.kwargs["HEAD_MAJOR"]] or [
                _cfg(names, (*_key(kept[0] if kept else configs[0], names)[:4], True))
            ]
        kept = kept or configs[:1]
        return kept

    return prune


def _autotune_kwargs() -> dict:
    # Shorter benchmarking than Triton's default (25 ms warm-up, 100 ms repeats) so a first call
    # at a new shape tunes in seconds; medians of ~20 launches separate these configs well.
    params = inspect.signature(triton.autotune).parameters
    if "do_bench" in params:

        def bench(fn, quantiles=None):
            return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)

        return {"do_bench": bench}
    return {}


_TUNE_KEY = ["HEAD_DIM", "CAUSAL", "NQ_BUCKET", "NK_BUCKET"]  # dtypes are added by Triton
# Sequence lengths and head counts are not specialised on (divisibility by 16, == 1): one binary
# per (head dim, dtype, causal, config) serves every length, so tuning compiles each config once.
_NO_SPEC = ["H", "n_q", "n_k", "NQ_BUCKET", "NK_BUCKET"]
