"""The predicted peak of one training step per device, from whichever memory model fits the run:
the fast model's (`fast_memory`, sharded or not), FSDP's accounting over the eager model
(`fsdp`), or the eager model's (`memory`). The checkpoint planner and `lmscope ddp`'s check of its
paired unwrapped step ask the same question, so they ask it here.
"""

from __future__ import annotations

from lmscope.accounting.fast_memory import predict_fast_memory
from lmscope.accounting.fsdp import predict_fsdp
from lmscope.accounting.memory import predict_memory
from lmscope.config import ModelConfig


def predicted_step_peak(config: ModelConfig, *, batch_size: int, seq_len: int, mode: str, precision: str,
                        attention: str, checkpoint: str, fast: bool, world_size: int = 1,
                        optimizer_state: str = "device") -> int:
    """Peak bytes allocated per device over a step of `mode` (the fast model: a train step), with
    AdamW's moments where `optimizer_state` says under FSDP."""
    point = dict(batch_size=batch_size, seq_len=seq_len, precision=precision, attention=attention,
                 checkpoint=checkpoint)
    if fast:
        return predict_fast_memory(config, world_size=world_size, optimizer_state=optimizer_state,
                                   **point).step_peak
    if world_size > 1:
        return predict_fsdp(config, world_size=world_size, optimizer_state=optimizer_state, **point).peak
    return predict_memory(config, mode=mode, **point).step_peak
