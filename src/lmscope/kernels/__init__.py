"""lmscope's own kernels: one op per module, each with its host function and autograd.Function.

FlashAttention-2:

- ``flash_attention``: forward and backward in Triton (``flash_attention(q, k, v, causal)``), a
  package: its public face in ``__init__``, planning, dispatch, the C++ hand-over, launching,
  tuning and the kernels in one module each (its docstring has the map).
- ``flash_attention_torch``: the same algorithm tiled in plain PyTorch (CPU and GPU).
- ``attention_reference``: naive float64 attention returning O and the log-sum-exp L, and the
  same-dtype naive attention the tests take their tolerance from.

``shadow_copies`` is the contract between ``adamw.FusedAdamW`` and a model's low-precision weight
copies: no module here imports ``lmscope.model`` (tests/kernels/test_kernels_layering.py).

Nothing here touches the GPU at import time; import the submodules directly.
"""
