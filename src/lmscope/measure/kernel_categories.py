"""What a GPU kernel (or, on a CPU, an aten op) does, read from its name; and a short name for tables.

Names come from CUDA (cuBLAS/CUTLASS GEMMs such as `ampere_sgemm_128x64_tn`, `sm90_xmma_gemm_...`,
`nvjet_...`), from PyTorch's own templates (`void at::native::vectorized_elementwise_kernel<...>`),
from Triton (`_attn_fwd`, Inductor's `triton_poi_*` pointwise and `triton_per_*`/`triton_red_*`
reduction kernels), from NCCL, from the copy engines (`Memcpy DtoD (Device -> Device)`), and on a
CPU from aten ops (`aten::mm`). Rules are checked in order, the first match wins: a FlashAttention
kernel built on CUTLASS is attention, not matmul; a fused-Adam `multi_tensor_apply_kernel` is the
optimizer, not elementwise.
"""

from __future__ import annotations

import re

CATEGORIES = (
    "matmul", "attention", "elementwise", "reduction", "optimizer", "memcpy", "communication", "other",
)
"""Every kernel falls in exactly one; `memcpy` holds memcpy and memset."""

CATEGORY_LABELS = {"memcpy": "memcpy/memset"}
"""Table labels where the key alone would mislead."""

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (category, re.compile(pattern, re.IGNORECASE))
    for category, pattern in (
        ("communication", r"nccl|c10d::|allreduce|all_reduce|allgather|reduce_scatter|alltoall"),
        ("memcpy", r"^memcpy|^memset|\bmemcpy|\bmemset"),
        ("optimizer", r"multi_tensor_apply|adam|_foreach_|amp_foreach|non_finite_check|fused_sgd"),
        ("attention", r"flash|fmha|attn|attention|sdpa|sdp_|_efficient_attention"),
        ("matmul", r"gemm|gemv|cutlass|wgmma|xmma|nvjet|cublas|splitkreduce|matmul"
                   r"|^aten::(mm|bmm|addmm|baddbmm|addmv|mv|dot|linear)$|^aten::\w*conv"),
        ("reduction", r"softmax|norm(?!al)|reduce|triton_(per|red)_|cross_entropy|nll_loss"
                      r"|^aten::(mean|sum|max|min|amax|amin|argmax|argmin|std|var|prod|logsumexp)$"),
        ("elementwise", r"elementwise|vectorized|triton_poi_|functor|copy|fill|index|catarray|triu|tril"
                        r"|where|masked|gather|scatter|embedding|^aten::"),
    )
)

_NO_WORK_OPS = re.compile(
    r"^aten::(empty|empty_strided|empty_like|view|reshape|_reshape_alias|transpose|t|permute|expand"
    r"|as_strided|as_strided_|detach|detach_|alias|unsqueeze|squeeze|select|slice|narrow|split|chunk|unbind"
    r"|flatten|unflatten|contiguous|resize_|set_|result_type|lift_fresh|is_nonzero|item"
    r"|_local_scalar_dense|zeros_like|ones_like|new_empty|new_empty_strided|_unsafe_view|to|numel"
    r"|resolve_conj|resolve_neg|conj|_conj|size|stride|dim|sym_size|is_same_size)$"
)
"""aten ops that only make views, allocate or check flags: 'other', not elementwise work."""

_AUTOGRAD_NODES = re.compile(r"^(torch::)?autograd::|^[A-Za-z]\w*Backward\d+$")
"""CPU ranges of the autograd engine around the ops of a backward node ('autograd::engine::
evaluate_function: EmbeddingBackward0', 'EmbeddingBackward0'): bookkeeping, whatever the node's name."""


def classify(name: str) -> str:
    """The category of a kernel or aten op name (one of CATEGORIES)."""
    if _NO_WORK_OPS.match(name) or _AUTOGRAD_NODES.match(name):
        return "other"
    for category, pattern in _RULES:
        if pattern.search(name):
            return category
    return "other"


_GENERIC_BASES = {"kernel", "kernel2", "device_kernel", "kernel_entry", "launch_kernel"}
_FUNCTOR_SUFFIXES = ("Functor", "Ops", "Op", "Epilogue", "_kernel")
"""Template arguments that say what a generic kernel computes, most telling first."""


def short_name(name: str, width: int = 64) -> str:
    """A readable name: no return type, namespaces, template or call arguments (a functor kept).

    'void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>'
    becomes 'vectorized_elementwise_kernel (CUDAFunctor_add)'; names without templates stay as
    they are (up to `width` characters).
    """
    text = name.replace("(anonymous namespace)::", "").strip()
    if text.startswith("void "):
        text = text[5:]
    cut = _first_open(text)
    base, rest = text[:cut].strip(), text[cut:]
    base = base.split("::")[-1] or text
    if base.lower() in _GENERIC_BASES and rest.startswith("<"):
        inner = re.match(r"<\s*([A-Za-z_][A-Za-z0-9_]*)", rest)
        base = inner.group(1) if inner else base
    elif rest.startswith("<"):
        functor = _functor(rest)
        if functor:
            base = f"{base} ({functor})"
    return base if len(base) <= width else base[: width - 3] + "..."


def _functor(arguments: str) -> str | None:
    """The last functor-like identifier in template arguments (the innermost, most specific one)."""
    for suffix in _FUNCTOR_SUFFIXES:
        found = [f for f in re.findall(rf"[A-Za-z_][A-Za-z0-9_]*{suffix}[A-Za-z0-9_]*", arguments)
                 if not f.startswith("gpu_kernel")]
        if found:
            return found[-1]
    return None


def _first_open(text: str) -> int:
    """Index of the first '<' or '(' that opens template or call arguments (len if none)."""
    for index, char in enumerate(text):
        if char in "<(" and index > 0:
            return index
    return len(text)
