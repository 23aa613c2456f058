"""Host microseconds per eager forward+backward: flash's C++ host path, its Python Function, SDPA.

The three are timed in interleaved repeats in one process (``host_timing.host_us`` each, the GPU
held by a sleep kernel while the calls are issued), so each repeat gives a ratio to SDPA from
one moment of the host; the rows hold every repeat, and the summary prints the median ratios
and their range. The C++ path is the public ``flash_attention`` once the plan has been handed
over (the warm-up calls do that); the Python Function is the same call inside
``flash_attention.python_path()``.

Usage (GPU machine): PYTHONPATH=src python3 benchmarks/attention/host_native.py
[--shape B,H,S,D] [--out X.jsonl]   (REPEATS below)
"""

from __future__ import annotations

import statistics

import torch.nn.functional as F
from host_timing import append_parts, attention_inputs, host_us, shape_and_out

from lmscope.kernels import flash_attention as fa
from lmscope.kernels.flash_attention import native_path as fa_native

REPEATS = 7


def main() -> None:
    shape, out = shape_and_out(__doc__.splitlines()[0])
    q, k, v, do = attention_inputs(shape)

    def flash() -> None:
        fa.flash_attention(q, k, v, causal=True).backward(do)

    def python() -> None:
        with fa.python_path():
            fa.flash_attention(q, k, v, causal=True).backward(do)

    def sdpa() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    for _ in range(fa_native._NATIVE_TRIES + 1):
        flash()
    native = "Native" in fa.flash_attention(q, k, v, causal=True).grad_fn.name()
    parts = {"flash: forward+backward, C++ host path": flash,
             "flash: forward+backward, Python Function": python,
             "sdpa: forward+backward through autograd": sdpa}  # fmt: skip
    runs: dict[str, list[float]] = {name: [] for name in parts}
    for repeat in range(REPEATS):
        measured = {name: host_us(fn) for name, fn in parts.items()}
        for name, us in measured.items():
            runs[name].append(us)
        if out:
            append_parts(out, "attention-host-native", shape,
                         {f"{name} (repeat {repeat})": us for name, us in measured.items()})  # fmt: skip
    print(f"shape {shape}, bf16, causal; C++ path taken: {native}; {REPEATS} interleaved repeats")
    sdpa_us = runs["sdpa: forward+backward through autograd"]
    for name, values in runs.items():
        ratios = [a / b for a, b in zip(values, sdpa_us, strict=True)]
        print(f"| {name} | median {statistics.median(values):.1f} us | x SDPA median "
              f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}) |")


if __name__ == "__main__":
    main()
