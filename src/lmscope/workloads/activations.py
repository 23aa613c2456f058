"""`lmscope memory --activations`: one step measuring what is saved for backward, and the peak's parts.

The step frees the gradients (set_to_none), resets the peak, runs its forward (and loss) under
`SavedActivations`, reads the allocated bytes at the end of the forward, then runs backward and
the optimizer. Its row fields:

* `saved_by_block`, `saved_by_op` (the top ops), `saved_by_module`, `gradients_by_block`: lists,
  in MiB; for lmscope's eager Transformer each block carries the memory model's bytes per block
  (`saved_activations_by_group`) and the error in percent, `saved_block_error_pct` the largest.
* The breakdown of the step's measured peak, in GiB, adding up to `breakdown_peak_gib`:
  parameters, gradients (alive at the end of the forward), optimizer state, activations saved for
  backward, autocast's weight copies, `other` (the rest alive at the end of the forward: batch,
  buffers, logits, loss) and `after_forward` (what the backward and optimizer add on top: the
  gradients being made, temporaries). The first five are counted from the tensors themselves
  (each storage once); `other` and `after_forward` are the measured totals minus them, so on a
  GPU they also hold the allocator's rounding.
"""

from __future__ import annotations

from typing import Any

import torch

from lmscope.accounting.memory import GIB, attention_kernel, checkpointed_blocks, saved_activations_by_group
from lmscope.measure.memory import MemoryMeter
from lmscope.measure.saved_activations import OUTSIDE, SavedActivations, unique_bytes
from lmscope.measure.timer import synchronize
from lmscope.model.transformer import TransformerLM
from lmscope.workloads.train_step import TrainStep

MIB = 2**20


def activations_step(step: TrainStep, meter: MemoryMeter, spec: Any) -> dict[str, Any]:
    """Run one instrumented step; return the saved-activation fields and the peak's breakdown."""
    device = step.device
    step.model.zero_grad(set_to_none=True)
    synchronize(device)
    meter.reset_peak()
    saved = SavedActivations(step.model)
    parts: dict[str, int] = {}
    forward_end = 0
    for name, run in step.phases():
        if name != "forward":
            run()
            continue
        with saved.recording():
            run()
        synchronize(device)
        forward_end = meter.current()
        parts = {
            "parameters": unique_bytes(step.model.parameters()),
            "gradients": unique_bytes(p.grad for p in step.model.parameters()),
            "optimizer_state": unique_bytes(_optimizer_tensors(step.optimizer)),
            "activations": saved.total_bytes,
            "weight_copies": saved.weight_copy_bytes,
        }
    synchronize(device)
    peak = meter.peak()
    record = saved.as_record()
    breakdown = {f"breakdown_{k}_gib": v / GIB for k, v in parts.items()}
    breakdown["breakdown_other_gib"] = (forward_end - sum(parts.values())) / GIB
    breakdown["breakdown_after_forward_gib"] = (peak - forward_end) / GIB
    breakdown["breakdown_peak_gib"] = peak / GIB
    record.update(breakdown)
    if isinstance(step.model, TransformerLM):
        record.update(_beside_formula(record, spec, device))
    return record


def _optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


def _beside_formula(record: dict[str, Any], spec: Any, device: torch.device) -> dict[str, Any]:
    """Predicted bytes beside each measured group; the largest block error; the total's error."""
    config = spec.model_config()
    kernel = attention_kernel(spec.attention, spec.precision) if device.type == "cuda" else (
        "naive" if spec.attention == "naive" else "flash")  # CPU SDPA lays its output out like flash
    groups = saved_activations_by_group(config, batch_size=spec.batch_size, seq_len=spec.context_length,
                                        precision=spec.precision, attention=spec.attention, kernel=kernel)
    checkpointed = {f"layers.{i}" for i in checkpointed_blocks(spec.checkpoint_policy(), config.num_layers)}
    names = {"ln_final": "ln_final", "lm_head": "lm_head", OUTSIDE: "loss"}
    errors = []
    for row in record["saved_by_block"]:
        block = row["block"]
        if block.startswith("layers."):
            predicted = groups["checkpointed_block" if block in checkpointed else "block"]
        else:
            predicted = groups.get(names.get(block, ""), 0)
        row["predicted_mib"] = predicted / MIB
        row["error_pct"] = 100.0 * (predicted / MIB - row["saved_mib"]) / row["saved_mib"]
        if block.startswith("layers."):
            errors.append(row["error_pct"])
    blocks = config.num_layers - len(checkpointed)
    total = (blocks * groups["block"] + len(checkpointed) * groups["checkpointed_block"]
             + groups["ln_final"] + groups["lm_head"] + groups["loss"])
    measured = record["saved_activations_gib"] * GIB
    return {
        "saved_block_predicted_mib": groups["block"] / MIB,
        "saved_block_error_pct": max(errors, key=abs) if errors else None,
        "saved_activations_predicted_gib": total / GIB,
        "saved_activations_error_pct": 100.0 * (total - measured) / measured if measured else None,
        "saved_activations_kernel": kernel,
    }
