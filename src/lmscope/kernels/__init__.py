"""lmscope's own kernels: one op per module, each with its host function and autograd.Function.

FlashAttention-2:

- ``flash_attention``: forward and backward in Triton (``flash_attention(q, k, v, causal)``).
- ``flash_attention_torch``: the same algorithm tiled in plain PyTorch (CPU and GPU).
- ``attention_reference``: naive float64 attention returning O and the log-sum-exp L, and the
  same-dtype naive attention the tests take their tolerance from.

Nothing here touches the GPU at import time; import the submodules directly.
"""
