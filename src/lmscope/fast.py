"""lmscope's fast path for one's own training loop: `apply_to_hf_model` runs a transformers Llama,
Qwen2 or Mistral model through lmscope's fused kernels in place (see docs/own_model.md).

Importing this module imports no Triton kernel; `apply_to_hf_model` does.
"""

from lmscope.model.hf_fast import FastPatch, apply_to_hf_model, fast_patch_of, plan_fast_patch

__all__ = ["FastPatch", "apply_to_hf_model", "fast_patch_of", "plan_fast_patch"]
