"""The grid of `lmscope attention`: its implementations, dtypes, passes and presets by name,
expanded and checked without importing torch.

The command line builds the grid here before it imports the workload (torch alone takes seconds
to import), so a typo is refused at once; `lmscope.workloads.attention.Spec` checks each point
with the same functions, and `attention_impls` registers one implementation per name here.
"""

from __future__ import annotations

from typing import Any

from lmscope.inputs.choices import check_device_name, one_of
from lmscope.inputs.comma_list import list_items

SDPA_BACKENDS = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-math": "MATH",
}
"""Benchmark name -> torch.nn.attention.SDPBackend member."""

IMPL_NAMES = ("flash-triton", "flash-torch", *SDPA_BACKENDS, "naive", "naive-compiled")
"""Implementations, ours first: `--compare impl` puts the first name in the base column."""

DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""--dtype name -> the torch dtype's attribute name."""

PASSES = ("fwd", "bwd", "fwd_bwd")
"""The passes a point may time, in the order they are reported."""

LEADERBOARD_PEERS = ["flash-triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "naive"]
"""Implementations of the reference workload, ours first (the base of `--compare impl` ratios)."""

PRESETS: dict[str, dict[str, Any]] = {
    "leaderboard": {
        "impl": LEADERBOARD_PEERS, "batch": [1], "heads": [16], "head_dim": [64], "seq_len": [16384],
        "dtype": ["bf16"], "causal": [True], "check_max_seq": 16384,
    },
    "classic": {
        "impl": ["all"], "batch": [8], "heads": [1], "head_dim": [16, 32, 64, 128],
        "seq_len": [256, 1024, 4096, 8192, 16384], "dtype": ["fp32", "bf16"], "causal": [True],
    },
    "tflops": {
        "impl": ["flash-triton", "sdpa-flash", "sdpa-cudnn"], "batch": [1], "heads": [16],
        "head_dim": [64, 128], "seq_len": [1024 * 2**i for i in range(7)], "dtype": ["bf16"],
        "causal": [True], "passes": "fwd,bwd",
    },
}
"""Named grids. leaderboard: the reference workload (batch 1, 16 heads, seq 16384, d 64, bf16,
causal, forward+backward) with every peer, checked against float64 at full size; classic: the
study's grid (batch 8, no head dim, d 16..128, seq 256..16384, fp32 and bf16, all
implementations); tflops: forward-only and backward-only TFLOP/s of the fast kernels for d 64
and 128 at seq 1k..64k."""

DEFAULT_GRID: dict[str, Any] = {
    "impl": ["all"], "batch": [8], "heads": [1], "head_dim": [64], "seq_len": [1024],
    "dtype": ["fp32"], "causal": [True],
}
"""The grid without a preset: every implementation at one shape."""

AXES = ("dtype", "causal", "batch", "heads", "head_dim", "seq_len", "impl")
"""Swept fields, outermost first: every shape runs all its implementations back to back."""


def check_impl(name: Any) -> None:
    """Refuse an implementation lmscope does not have."""
    if name not in IMPL_NAMES:
        raise ValueError(f"unknown attention impl {name!r}: choose from {', '.join(IMPL_NAMES)}")


check_dtype = one_of("dtype", tuple(DTYPE_NAMES))
"""Refuse a dtype name the benchmark does not run."""


def passes_in_order(passes: Any) -> str:
    """A --passes comma list as the passes it names in report order; ValueError for others."""
    asked = list_items(passes, "--passes") if str(passes).strip() else []
    if not asked or any(p not in PASSES for p in asked):
        raise ValueError(f"passes must be a comma list of {', '.join(PASSES)}, got {passes!r}: "
                         "pass e.g. --passes fwd,bwd")
    return ",".join(p for p in PASSES if p in asked)


def attention_grid(
    preset: str | None, overrides: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """(fixed, swept) fields for `inputs.grid.expand_grid`: the preset (or the default grid) with
    `overrides` (field -> list for an axis, value otherwise; None keeps the preset's) on top;
    'all' in impl stands for every implementation. Implementations, dtypes, passes and the
    device are checked here; the sizes and the rest by each point's Spec."""
    if preset is not None:
        one_of("preset", tuple(PRESETS))(preset)
    merged = {**DEFAULT_GRID, **(PRESETS[preset] if preset else {})}
    merged.update({key: value for key, value in overrides.items() if value is not None})
    impls: list[str] = []
    for name in merged["impl"]:
        impls += list(IMPL_NAMES) if name == "all" else [name]
    merged["impl"] = list(dict.fromkeys(impls))
    for name in merged["impl"]:
        check_impl(name)
    for name in merged["dtype"]:
        check_dtype(name)
    if "passes" in merged:
        passes_in_order(merged["passes"])
    check_device_name(merged.get("device", "auto"))
    swept = {axis: list(merged.pop(axis)) for axis in AXES}
    return merged, swept
