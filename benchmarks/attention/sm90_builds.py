"""Registers, spills and shared memory of FlashAttention's kernels built for sm_90, without a GPU.

Triton compiles for a target it is told (``triton.compile`` with ``GPUTarget("cuda", 90, 32)``)
and ships ``ptxas``; ``ptxas -v`` on the PTX reports registers per thread and spill bytes. The
pointer arguments and strides get the 16-byte divisibility the real launches specialise on
(without it Triton does not pipeline the loads and the report is of another kernel). Run from
the repository root (any machine; the Triton installed decides what is built):

    PYTHONPATH=src python3 benchmarks/attention/sm90_builds.py [--kernel fwd|dkdv|dq] [--head-dim 128]
    PYTHONPATH=src python3 benchmarks/attention/sm90_builds.py --kernel sm90 [--head-dim 128]

Prints one line per bf16 config the kernel's autotuner would try at that head dim (its "small"
list up to 64, its "large" list above): tile sizes, warps, stages, registers, spill stores and
loads, shared memory bytes, and whether the loads became async copies. ``--kernel sm90`` builds
the Gluon kernels (``lmscope.kernels.flash_sm90*``; the dK/dV kernel also as ``dkdv-atomic``, with
the atomic dQ mode's reduce-adds) from host-side TMA descriptors instead
and prints, per kernel, the spills, the shared memory and each partition's register budget
(``setmaxnreg``; ptxas's register count is the kernel's budget before the partitions set theirs).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

try:  # run from the repo root without installing
    import lmscope  # noqa: F401
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from lmscope.kernels import flash_sm90, flash_sm90_dkdv, flash_sm90_dq  # noqa: E402
from lmscope.kernels.flash_attention import triton_kernels as fa_kernels  # noqa: E402
from lmscope.kernels.flash_attention import tuning as fa_tuning  # noqa: E402

# kernel, its tile names, its config table (flash_attention's lists per head-dim group)
KERNELS = {"fwd": (fa_kernels._attn_fwd, ("BLOCK_M", "BLOCK_N"), fa_tuning._FWD),
           "dkdv": (fa_kernels._attn_bwd_dkdv, ("BLOCK_M1", "BLOCK_N1"), fa_tuning._DKDV),
           "dq": (fa_kernels._attn_bwd_dq, ("BLOCK_M2", "BLOCK_N2"), fa_tuning._DQ)}  # fmt: skip
_FP32_ARGS = ("LSE", "DELTA", "DQ_ACC")
_SCALARS = ("qk_scale", "sm_scale")


def _ptxas() -> str:
    """The ptxas Triton itself uses for sm_90 (newer Tritons pick another of their binaries)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(90).path


def build(kernel, constexprs: dict, num_warps: int, num_stages: int) -> dict:
    """One sm_90 build of ``kernel`` (a JITFunction): ptxas's report and Triton's metadata."""
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in _SCALARS:
            sig[name] = "fp32"
        elif name.isupper() and name != "H" and not name.endswith("BUCKET"):
            sig[name] = "*fp32" if name in _FP32_ARGS else "*bf16"
        else:
            sig[name] = "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if sig[n].startswith("*") or n.startswith("stride")}  # fmt: skip
    compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})  # fmt: skip
    report = _ptxas_report(compiled.asm["ptx"])
    regs = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    ttgir = compiled.asm["ttgir"]
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_stores": int(spills.group(1)) if spills else None,
            "spill_loads": int(spills.group(2)) if spills else None,
            "shared_bytes": compiled.metadata.shared,
            "async_copies": "async_copy" in ttgir or "async_tma" in ttgir}  # fmt: skip


def _ptxas_report(ptx_text: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(ptx_text)
        return subprocess.run([_ptxas(), "-arch=sm_90a", "-v", ptx, "-o", os.path.join(tmp, "k.cubin")],
                              capture_output=True, text=True, check=True).stderr  # fmt: skip


def _tensor(head_dim: int, token_major: bool):
    """A (1, 2, 256, d) bf16 stand-in on the CPU, in (B, H, n, d) or (B, n, H, d) memory."""
    import torch

    if token_major:
        return torch.empty(1, 256, 2, head_dim, dtype=torch.bfloat16).transpose(1, 2)
    return torch.empty(1, 2, 256, head_dim, dtype=torch.bfloat16)


def gluon_build(name: str, head_dim: int, causal: bool = True) -> tuple[str, int]:
    """(PTX, shared bytes) of one Gluon kernel ("forward", "dq" or "dkdv") built for sm_90 from
    the arguments its real launch would get (the modules' ``*_launch``): Q, K, V and the
    gradients in (B, H, n, d) memory, O and dO in (B, n, H, d) memory, CPU stand-ins."""
    import torch
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    x, y = _tensor(head_dim, False), _tensor(head_dim, True)
    rows = torch.empty(256, dtype=torch.float32)  # L and D
    if name == "forward":
        module, kernel = flash_sm90, flash_sm90._attn_fwd_sm90
        _, args = flash_sm90.forward_launch(x, x, x, y, rows, causal, 1.0)
    elif name == "dq":
        module, kernel = flash_sm90_dq, flash_sm90_dq._attn_bwd_dq_sm90
        _, args = flash_sm90_dq.dq_launch(x, x, x, y, y, rows, rows, x, causal, 1.0, 1.0)
    else:  # "dkdv", or "dkdv-atomic": dQ added by atomics too
        module, kernel = flash_sm90_dkdv, flash_sm90_dkdv._attn_bwd_dkdv_sm90
        dq_acc = torch.empty(x.numel(), dtype=torch.float32) if name == "dkdv-atomic" else None
        _, args = flash_sm90_dkdv.dkdv_launch(x, x, x, y, rows, rows, x, x, causal, 1.0, 1.0, dq_acc)
    if set(args) != set(kernel.arg_names):  # the launch names the kernel's arguments, all of them
        odd = sorted(set(args) ^ set(kernel.arg_names))
        raise ValueError(f"{name}: the launch's arguments and the kernel's differ in {odd}")
    names = kernel.arg_names
    constant = {p.name for p in kernel.params if p.is_constexpr}
    signature = {n: "constexpr" if n in constant else mangle_type(args[n]) for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n, kind in signature.items()
             if kind.startswith("*")}  # fmt: skip
    constexprs = {(names.index(n),): args[n] for n in names if n in constant}
    source = GluonASTSource(kernel, signature, constexprs, attrs)
    options = {"num_warps": module.NUM_WARPS}
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    return compiled.asm["ptx"], compiled.metadata.shared


def _gluon_report(head_dim: int, causal: bool) -> None:
    for name in ("forward", "dq", "dkdv", "dkdv-atomic"):
        ptx, shared = gluon_build(name, head_dim, causal)
        report = _ptxas_report(ptx)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
        budgets = sorted({int(n) for n in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)})
        stores, loads = spills.groups() if spills else (None, None)
        print(f"{name:>11}  spill_stores {stores}  spill_loads {loads}  shared_bytes {shared}  "
              f"setmaxnreg {budgets}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=[*sorted(KERNELS), "sm90"], default="fwd")
    parser.add_argument("--head-dim", type=int, default=128, choices=(16, 32, 64, 128))
    parser.add_argument("--causal", choices=("on", "off"), default="on")
    args = parser.parse_args()
    if args.kernel == "sm90":
        if args.head_dim not in flash_sm90.HEAD_DIMS or not flash_sm90.HAVE_GLUON:
            dims = " or ".join(map(str, flash_sm90.HEAD_DIMS))
            parser.error(f"the Gluon kernels need Gluon and head dim {dims}")
        print(f"triton {triton.__version__}, sm_90, Gluon kernels, head dim {args.head_dim}, "
              f"causal {args.causal}, bf16")  # fmt: skip
        _gluon_report(args.head_dim, args.causal == "on")
        return
    autotuned, names, table = KERNELS[args.kernel]
    kernel = autotuned.fn
    d = args.head_dim
    print(f"triton {triton.__version__}, sm_90, {args.kernel}, head dim {d}, causal {args.causal}, bf16")
    for config in (fa_tuning._cfg(names, t) for t in table["small" if d <= 64 else "large"]):
        constexprs = {"HEAD_DIM": d, "D_MAIN": d, "D_TAIL": 0, "D_PAD": d, "CAUSAL": args.causal == "on",
                      "DOT_PREC": "tf32", "ATOMIC_DQ": False, "ACC64": False, **config.kwargs}  # fmt: skip
        constexprs = {k: v for k, v in constexprs.items() if k in kernel.arg_names}
        tiles = " x ".join(str(config.kwargs[n]) for n in names)
        try:
            found = build(kernel, constexprs, config.num_warps, config.num_stages)
        except Exception as error:  # a config this Triton cannot build for sm_90: say so, go on
            print(f"{tiles:>10}  warps {config.num_warps}  stages {config.num_stages}  build failed: "
                  f"{str(error).splitlines()[0][:120]}")  # fmt: skip
            continue
        facts = "  ".join(f"{k} {v}" for k, v in found.items())
        print(f"{tiles:>10}  warps {config.num_warps}  stages {config.num_stages}  head-major "
              f"{int(config.kwargs['HEAD_MAJOR'])}  {facts}")  # fmt: skip


if __name__ == "__main__":
    main()
