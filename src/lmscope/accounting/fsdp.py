"""Predicted memory per rank and bytes moved per step of fully sharded data parallelism (FSDP).

For lmscope's FullyShardedDP over the reference model (units: the embedding, each block, the LM
head; the root holds the final norm, and the head too on the fast path, which reads the head's
weight directly). Per rank and step, with N ranks and c bytes per compute-dtype element:

* state: each unit's fp32 master shard is ceil(n_unit / N) elements (padding included); its fp32
  gradient and AdamW's two fp32 moments are as large: 16 bytes per shard element; with the moments
  on the host (`optimizer_state="host"`) only the root's and the first unit's stay on the device,
  the others' (8 bytes per shard element in pinned host memory) visit it while their unit's
  backward runs, `HOST_STATE_UNITS_IN_FLIGHT` units at a time;
* gathered units in flight: the root all step, the current unit and two prefetched ones in the
  forward; in the backward also the gradient of the unit being reduce-scattered and the root's;
* activations: what the unsharded model keeps for backward (`predict_memory`'s activations,
  logits and recompute components, same checkpointing);
* bytes moved (what each rank's collectives produce): all-gather in the forward (every unit and
  the root), all-gather in the backward (every unit but the last; the last and the root stay
  gathered), reduce-scatter of every trainable unit's gradient (input size, in the reduce dtype).

An approximation of the peak: master shards and optimizer state (not yet the shard gradients) +
the largest in-flight window + activations; short-lived
buffers of one op (attention scores, the fused loss's chunk) are not in it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmscope.accounting.memory import predict_memory
from lmscope.config import ModelConfig

PREFETCH_UNITS = 2
"""Units gathered ahead of the one running (lmscope.parallel.fsdp.PREFETCH_UNITS)."""
OPTIMIZER_STATES = ("device", "host")
"""Where AdamW's moments live: all on the device, or (lmscope.parallel.host_adamw) in pinned host
memory but for the root's and the first unit's, which are reduced last."""
HOST_STATE_UNITS_IN_FLIGHT = 2
"""Units whose moments are on the device at once with host optimizer state
(mirrors lmscope.parallel.host_adamw's in-flight units, like PREFETCH_UNITS mirrors the wrapper's)."""
COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def check_optimizer_state(optimizer_state: str) -> None:
    """Refuse a placement of AdamW's moments other than OPTIMIZER_STATES, in one line."""
    if optimizer_state not in OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer state {optimizer_state!r}: choose one of "
                         f"{', '.join(OPTIMIZER_STATES)} (--optimizer-state)")


def unit_numels(config: ModelConfig, *, fast: bool) -> tuple[list[int], int]:
    """(parameters of each unit in forward order, parameters of the root)."""
    d, v = config.d_model, config.vocab_size
    block = 2 * d + 4 * d * d + 3 * d * config.d_ff
    units = [v * d] + [block] * config.num_layers
    if fast:
        return units, d + v * d
    return units + [v * d], d


@dataclass(frozen=True)
class FsdpPrediction:
    """Bytes per rank (memory) and per rank and step (collective outputs)."""

    params: int
    grads: int
    optimizer_state: int
    gathered_forward: int
    gathered_backward: int
    activations: int
    allgather_forward: int
    allgather_backward: int
    reduce_scatter: int
    optimizer_state_host: int = 0
    """AdamW's moments in pinned host memory (host optimizer state); `optimizer_state` is the device's."""
    optimizer_in_flight: int = 0
    """Host optimizer state: the device slots the moments of the units in flight pass through
    (allocated at the first backward and kept)."""

    @property
    def state(self) -> int:
        """Master shards, their gradients and AdamW's moments on the device, with the slots of the
        moments in flight (what a step leaves)."""
        return self.params + self.grads + self.optimizer_state + self.optimizer_in_flight

    @property
    def peak(self) -> int:
        """Master shards + optimizer state + the largest gathered window + activations.

        The shard gradients are not in it: the step starts with them freed (zero_grad sets them
        to None), and the backward makes each unit's only as it frees far more of that unit's
        activations, so at the peak (the forward's end) they do not exist yet.
        """
        return (self.params + self.optimizer_state + self.optimizer_in_flight
                + max(self.gathered_forward, self.gathered_backward) + self.activations)

    def as_record(self) -> dict[str, float]:
        """Flat dict in GiB: predicted_fsdp_<part>_gib."""
        gib = 2**30
        parts = {
            "params": self.params, "grads": self.grads, "optimizer_state": self.optimizer_state,
            "state": self.state, "gathered_forward": self.gathered_forward,
            "gathered_backward": self.gathered_backward, "activations": self.activations,
            "peak": self.peak, "allgather_forward": self.allgather_forward,
            "allgather_backward": self.allgather_backward, "reduce_scatter": self.reduce_scatter,
            "comm": self.allgather_forward + self.allgather_backward + self.reduce_scatter,
            "optimizer_state_host": self.optimizer_state_host,
            "optimizer_in_flight": self.optimizer_in_flight,
        }
        return {f"predicted_fsdp_{name}_gib": value / gib for name, value in parts.items()}


def predict_fsdp(config: ModelConfig, *, world_size: int, batch_size: int, seq_len: int,
                 precision: str, attention: str = "naive", checkpoint: str = "none",
                 fast: bool = False, optimizer_state: str = "device") -> FsdpPrediction:
    """Memory per rank and bytes per step of FullyShardedDP (compute and reduce in `precision`),
    AdamW's moments where `optimizer_state` says (OPTIMIZER_STATES)."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}: pass --fsdp N")
    if precision not in COMPUTE_BYTES:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(COMPUTE_BYTES)}")
    check_optimizer_state(optimizer_state)
    units, root = unit_numels(config, fast=fast)
    c = COMPUTE_BYTES[precision]
    padded = [math.ceil(n / world_size) * world_size for n in units]
    padded_root = math.ceil(root / world_size) * world_size
    shard = sum(p // world_size for p in padded) + padded_root // world_size
    window = max(sum(padded[i: i + PREFETCH_UNITS + 1]) for i in range(len(padded)))
    backward = max(2 * padded[i] + sum(padded[max(i - PREFETCH_UNITS, 0): i]) for i in range(len(padded)))
    moments, moments_host, in_flight, grads = 8 * shard, 0, 0, 4 * shard
    if optimizer_state == "host":  # the root's and the first unit's stay; the others visit
        others = [p // world_size for p in padded[1:]]
        moments = 8 * (padded_root // world_size + padded[0] // world_size)
        in_flight = HOST_STATE_UNITS_IN_FLIGHT * 8 * max(others, default=0)
        moments_host = 8 * sum(others)
        grads = 0  # each unit is updated from its reduced gradient: no fp32 shard gradient is kept
    unsharded = predict_memory(config, batch_size=batch_size, seq_len=seq_len, mode="train-step",
                               precision=precision, attention=attention, checkpoint=checkpoint)
    parts = unsharded.components
    activations = parts["activations"] + parts.get("recompute", 0) + (0 if fast else parts["logits"])
    return FsdpPrediction(
        params=4 * shard, grads=grads, optimizer_state=moments, optimizer_state_host=moments_host,
        optimizer_in_flight=in_flight,
        gathered_forward=c * (padded_root + window),
        gathered_backward=c * (2 * padded_root + backward),
        activations=activations,
        allgather_forward=c * (sum(padded) + padded_root),
        allgather_backward=c * sum(padded[:-1]),
        reduce_scatter=c * (sum(padded) + padded_root),
    )
