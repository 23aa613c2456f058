"""Give back what a finished point left on the device, so that the next point in the same process
(a reused worker, or the sharded step after its paired unwrapped one) starts from the same state.

It imports torch only if the point did: the runner calls it after every point, torch or not.
"""

from __future__ import annotations

import gc
import sys


def release_device_memory() -> None:
    """Collect garbage (cycles still holding tensors), then empty the CUDA caching allocator."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
