"""lmscope's own GPU kernels: one op per module, each with its autograd.Function.

- ``flash_attention``: FlashAttention-2 forward and backward in Triton.
- ``flash_attention_torch``: the same algorithm tiled in plain PyTorch (CPU and GPU).
- ``attention_reference``: naive float64 attention returning O and the log-sum-exp L.

Nothing here touches the GPU at import time; import the submodules directly.
"""
