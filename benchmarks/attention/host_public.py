"""Host microseconds per eager forward+backward through the public API, ours beside SDPA's.

Only ``lmscope.kernels.flash_attention.flash_attention`` and PyTorch's SDPA are called, so the
same script measures any lmscope source tree put first on PYTHONPATH: the before/after runs of a
host-path change (benchmarks/attention/before_after.sh) time both trees with it in one session.
Timing: ``host_timing.host_us`` (the GPU held by a sleep kernel while the calls are issued).

Usage (GPU machine): PYTHONPATH=<src tree> python3 benchmarks/attention/host_public.py
[--shape B,H,S,D] [--out X.jsonl]
"""

from __future__ import annotations

import torch.nn.functional as F
from host_timing import append_parts, attention_inputs, host_us, print_parts, shape_and_out

from lmscope.kernels.flash_attention import flash_attention


def _fwd_bwd(attend, q, k, v, do):
    def call():
        attend(q, k, v).backward(do)

    return call


def main() -> None:
    shape, out = shape_and_out(__doc__.splitlines()[0])
    q, k, v, do = attention_inputs(shape)
    measured = {
        "flash: forward+backward through autograd": host_us(
            _fwd_bwd(lambda a, b, c: flash_attention(a, b, c, causal=True), q, k, v, do)),
        "sdpa: forward+backward through autograd": host_us(
            _fwd_bwd(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v, do)),
    }  # fmt: skip
    print_parts(shape, measured)
    flash, sdpa = measured.values()
    print(f"flash / sdpa: {flash / sdpa:.2f}x")
    if out:
        append_parts(out, "attention-host-public", shape, measured)


if __name__ == "__main__":
    main()
