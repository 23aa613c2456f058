"""The attention implementations `lmscope attention` compares, by name.

Each implementation is a context manager `prepare(device, dtype, head_dim, causal)` that yields a
function `(q, k, v) -> out` on (..., seq, d) tensors computing softmax(q k^T / sqrt(d)) v, causal
or not. Entering it is where the implementation checks that it can run at this point; one that
cannot raises `Unavailable` with a short reason, which the runner records as the point's error
line ("Unavailable: sdpa-cudnn needs CUDA"). Setting up inside the context (for SDPA, choosing the
backend once with `sdpa_kernel`) keeps that cost out of the timed calls.

- naive: scores, mask, softmax and output matmul in the inputs' dtype (one seq x seq matrix per
  head), as the classic study writes it; naive-compiled: the same function under
  torch.compile(dynamic=False), compiled afresh per point (see `_naive_compiled`).
- sdpa-flash, sdpa-cudnn, sdpa-efficient, sdpa-math: torch's scaled_dot_product_attention pinned
  to one backend. SDPA's fused backends need 4-d inputs, so 3-d (batch, seq, d) inputs are viewed
  as one head (a free view, the same data).
- flash-torch, flash-triton: lmscope's FlashAttention-2 (tiled PyTorch; Triton kernels). The Triton
  one runs on CUDA, or on CPU under TRITON_INTERPRET=1 (set before Triton is first imported).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator

import torch

from lmscope.envflags import env_flag
from lmscope.workloads.attention_grid import IMPL_NAMES, SDPA_BACKENDS, check_impl

AttentionCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
Calls = Iterator[AttentionCall]
Prepare = Callable[[torch.device, torch.dtype, int, bool], contextlib.AbstractContextManager[AttentionCall]]

FLASH_TRITON_MAX_HEAD_DIM = 128
"""Largest head dim the Triton kernels take."""


class Unavailable(RuntimeError):
    """An implementation cannot run at this point (device, dtype, head dim or a missing library)."""


@contextlib.contextmanager
def _naive(device: torch.device, dtype: torch.dtype, head_dim: int, causal: bool) -> Calls:
    from lmscope.kernels.attention_reference import attention_naive

    yield lambda q, k, v: attention_naive(q, k, v, causal)


@contextlib.contextmanager
def _naive_compiled(device: torch.device, dtype: torch.dtype, head_dim: int, causal: bool) -> Calls:
    """torch.compile(dynamic=False) of the naive function, with compile caches reset first.

    A worker that runs many points would otherwise hit dynamo's recompile limit after a few
    shapes and silently fall back to eager; resetting makes every point compile its own shape.
    The compile happens on the first call, which the benchmark makes before timing. AOTAutograd's
    donated buffers (a backward that reuses its saved tensors' memory) forbid
    backward(retain_graph=True), which the bwd-only timing needs, so they are off here.
    """
    import torch._functorch.config as functorch_config

    from lmscope.kernels.attention_reference import attention_naive

    torch.compiler.reset()
    compiled = torch.compile(attention_naive, dynamic=False)
    keep_buffers = (
        functorch_config.patch(donated_buffer=False)
        if hasattr(functorch_config, "donated_buffer") else contextlib.nullcontext()
    )
    with keep_buffers:
        yield lambda q, k, v: compiled(q, k, v, causal)


_NO_KERNEL = ("No available kernel", "No viable backend")


def _sdpa_checks(name: str, device: torch.device, dtype: torch.dtype) -> None:
    """The reasons torch gives least clearly, checked up front."""
    if name in ("sdpa-cudnn", "sdpa-efficient") and device.type != "cuda":
        raise Unavailable(f"{name} needs CUDA")
    if device.type == "cuda" and name in ("sdpa-flash", "sdpa-cudnn") and dtype == torch.float32:
        raise Unavailable(f"{name} supports fp16/bf16 only on CUDA, not fp32")
    if name == "sdpa-cudnn" and not torch.backends.cudnn.is_available():
        raise Unavailable("sdpa-cudnn needs cuDNN, which this torch build does not have")


def _why_not(name: str, caught: list[warnings.WarningMessage]) -> str:
    """torch's own reason for refusing a backend, from the warnings it emitted, in one line."""
    reasons = []
    for item in caught:
        text = re.sub(r"\s*\(Triggered internally at .*", "", str(item.message), flags=re.S).strip()
        if text and not text.endswith("because:"):
            reasons.append(" ".join(text.split()))
    detail = f": {reasons[0][:200]}" if reasons else ""
    return f"{name}: torch has no kernel for this point{detail}"


def _sdpa(name: str) -> Prepare:
    @contextlib.contextmanager
    def prepare(device: torch.device, dtype: torch.dtype, head_dim: int, causal: bool) -> Calls:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        _sdpa_checks(name, device, dtype)

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if q.ndim == 3:
                q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal).squeeze(1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        backend = getattr(SDPBackend, SDPA_BACKENDS[name])
        with warnings.catch_warnings(record=True) as caught, sdpa_kernel(backend):
            warnings.simplefilter("default")
            try:
                yield call
            except RuntimeError as error:
                if any(marker in str(error) for marker in _NO_KERNEL):
                    raise Unavailable(_why_not(name, caught)) from None
                raise

    return prepare


@contextlib.contextmanager
def _flash_torch(device: torch.device, dtype: torch.dtype, head_dim: int, causal: bool) -> Calls:
    from lmscope.kernels.flash_attention_torch import flash_attention_torch

    yield lambda q, k, v: flash_attention_torch(q, k, v, causal)


def triton_interpreter_on() -> bool:
    """Whether TRITON_INTERPRET asks Triton to run kernels on the CPU interpreter."""
    return env_flag("TRITON_INTERPRET")


@contextlib.contextmanager
def _flash_triton(device: torch.device, dtype: torch.dtype, head_dim: int, causal: bool) -> Calls:
    if device.type != "cuda" and not triton_interpreter_on():
        raise Unavailable("flash-triton runs Triton kernels, which need a CUDA GPU: on the CPU "
                          "time --impl flash-torch (the same algorithm in PyTorch)")
    if head_dim > FLASH_TRITON_MAX_HEAD_DIM:
        raise Unavailable(f"flash-triton takes head dims up to {FLASH_TRITON_MAX_HEAD_DIM}, not {head_dim}")
    try:
        from lmscope.kernels.flash_attention import flash_attention
    except ImportError as error:
        raise Unavailable(f"flash-triton needs Triton: {error}") from None
    yield lambda q, k, v: flash_attention(q, k, v, causal)


_OWN: dict[str, Prepare] = {
    "flash-triton": _flash_triton,
    "flash-torch": _flash_torch,
    "naive": _naive,
    "naive-compiled": _naive_compiled,
}
IMPLS: dict[str, Prepare] = {name: _sdpa(name) if name in SDPA_BACKENDS else _OWN[name]
                             for name in IMPL_NAMES}
"""Name -> prepare, in the order of `attention_grid.IMPL_NAMES` (ours first)."""

def prepare(
    name: str, device: torch.device, dtype: torch.dtype, head_dim: int, causal: bool
) -> contextlib.AbstractContextManager[AttentionCall]:
    """Context yielding the attention function of `name`; raises Unavailable when it cannot run."""
    check_impl(name)
    return IMPLS[name](device, dtype, head_dim, causal)
