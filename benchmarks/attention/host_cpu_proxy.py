"""A CPU proxy of flash attention's host cost: the Python around the launches, without a GPU.

Runs under Triton's CPU interpreter (TRITON_INTERPRET=1, set here before the import) with
CPU tensors, and replaces what would run a kernel by no-ops at the lowest level: each
launcher's JIT function returns a stand-in compiled kernel whose ``run`` does nothing, and
``DirectLaunch`` is told it may launch it directly (as on a GPU with a supported Triton). So
every line of lmscope's host code runs as on the GPU path (checks, plan, views, allocations,
``_Launcher``, ``DirectLaunch.launch`` and its key), only the kernels and the driver's device
and stream queries do not. Numbers are microseconds per call on this machine's CPU (median of
rounds); they compare variants of the host code on one machine, not the GPU host's numbers.

Usage (repo root): uv run python benchmarks/attention/host_cpu_proxy.py [--shape B,H,S,D]
[--rounds N] [--calls N]. To compare with another version of the code, run it with
PYTHONPATH pointing at that version's src/ (the script imports lmscope from sys.path).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from collections.abc import Callable

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from lmscope.kernels import flash_attention as fa  # noqa: E402
from lmscope.kernels.triton_launch import DirectLaunch  # noqa: E402

LAUNCHERS = ("_FWD_LAUNCH", "_DQ_LAUNCH", "_DKDV_LAUNCH")


class _NoKernel:
    """Stands in for a CompiledKernel: its launcher does nothing."""

    function, packed_metadata = 0, None

    def run(self, *call) -> None:
        return None


def _no_kernel_run(*args, grid, warmup, **kwargs) -> _NoKernel:
    return _NoKernel()


def stub_launches() -> None:
    """Every launcher's kernel replaced by a no-op, the direct launch path switched on."""
    for name in LAUNCHERS:
        launcher = getattr(fa, name)
        launcher.kernel.fn.run = _no_kernel_run  # what the autotuner's one config launches
        launcher.run = _no_kernel_run
        launcher.known.clear()

        class _Jit:
            run = staticmethod(_no_kernel_run)
            pre_run_hooks: list = []

        direct = DirectLaunch(_Jit(), supported=True)
        direct._device, direct._stream = (lambda: 0), (lambda device: 0)
        launcher.compiled = direct


def per_call_us(fn: Callable[[], object], calls: int, rounds: int) -> float:
    """Median over rounds of the microseconds per call of `calls` calls."""
    for _ in range(20):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter_ns() - start) / calls / 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4,25,512,64")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    ns = parser.parse_args()
    shape = tuple(int(s) for s in ns.shape.split(","))
    torch.set_num_threads(1)
    stub_launches()
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_out = torch.randn_like(q)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o, lse = fa.flash_attention_forward(qd, kd, vd, True)
    fwd, calls = fa._FWD_LAUNCH, []
    fa._FWD_LAUNCH = lambda *launch: (calls.append(launch), fwd(*launch))
    fa.flash_attention_forward(qd, kd, vd, True)
    fa._FWD_LAUNCH = fwd

    def fwd_bwd():
        out = fa.flash_attention(q, k, v, causal=True)
        return torch.autograd.grad(out, (q, k, v), d_out)

    rows = {
        "forward+backward through autograd (torch.autograd.grad)": fwd_bwd,
        "forward through autograd": lambda: fa.flash_attention(q, k, v, causal=True),
        "flash_attention_forward direct": lambda: fa.flash_attention_forward(qd, kd, vd, True),
        "flash_attention_backward direct": lambda: fa.flash_attention_backward(
            d_out, qd, kd, vd, o, lse, True),
        "_FWD_LAUNCH alone": lambda: fwd(*calls[0]),
    }
    print(f"shape {shape} bf16 causal, CPU proxy (launches are no-ops), us per call, "
          f"median of {ns.rounds} rounds of {ns.calls} calls; source {fa.__file__}")
    for name, fn in rows.items():
        print(f"{per_call_us(fn, ns.calls, ns.rounds):9.2f}  {name}")
    gc.collect()


if __name__ == "__main__":
    main()
