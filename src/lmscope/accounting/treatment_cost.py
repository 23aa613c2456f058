"""What each block treatment costs in time: recompute, rebuilt elementwise work, offload transfers.

Times are ideal device times from the catalog (`lmscope.accounting.devices`): matmul FLOPs at the
dense peak of the compute dtype, memory traffic at the HBM bandwidth, host transfers at the host
link's (PCIe, one direction; or a measured bandwidth given instead). Real kernels reach a share
of these peaks, so the numbers rank plans against each other; the share of the ideal step they
add (`extra_pct`) is what to compare, not milliseconds to a measurement.

* full: one more forward of the block's matmuls (attention at half the square for kernels that
  skip the masked tiles: all but naive attention);
* selective: the memory traffic of the rebuilt elementwise work (`BlockBytes.rebuild_traffic`);
* offload: each offloaded block's activations cross the host link twice. The copy to the host
  overlaps the next block's forward; the copy back overlaps the next block's backward when that
  block is offloaded too (it prefetches), else it is waited for. Only what a copy takes beyond the
  compute it overlaps counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmscope.accounting.devices import lookup
from lmscope.accounting.flops import forward_flops_by_component
from lmscope.accounting.treatments import FULL, SELECTIVE
from lmscope.config import ModelConfig

DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16"}


@dataclass(frozen=True)
class Rates:
    """Ideal rates of one device: FLOP/s, HBM bytes/s, host-link bytes/s (None if unknown)."""

    device: str
    flops: float
    hbm: float
    host: float | None

    @staticmethod
    def of(device: str, precision: str, host_link_gbps: float | None = None) -> Rates:
        """The catalog's figures for `device` (a catalog name or a driver name), host link overridable."""
        spec = lookup(device)
        peak = spec.peak(DTYPES.get(precision, precision)) if spec else None
        if spec is None or peak is None:
            raise ValueError(f"no catalog entry with a {precision} peak for device {device!r}: pass --device "
                             "with one of H100 SXM, H100 PCIe, H200, A100, B200")
        if host_link_gbps is not None and not 0 < host_link_gbps < math.inf:
            raise ValueError(f"host link bandwidth must be a positive finite number of GB/s, got "
                             f"{host_link_gbps!r}: e.g. --host-link-gbps 50")
        host = host_link_gbps if host_link_gbps is not None else spec.host_link_gbps
        return Rates(device=spec.name, flops=peak * 1e12, hbm=spec.hbm_gbps * 1e9,
                     host=host * 1e9 if host else None)


@dataclass(frozen=True)
class BlockBytes:
    """Per block: what offloading moves by kind, and the traffic of selective's rebuilt work."""

    moved: dict[str, int]
    rebuild_traffic: int


def block_forward_flops(config: ModelConfig, batch_size: int, seq_len: int, causal: bool) -> float:
    """Matmul FLOPs of one block's forward (attention over the causal pairs when `causal`, the
    model-FLOPs convention of `lmscope.accounting.flops`, else over the whole square)."""
    parts = forward_flops_by_component(config, batch_size, seq_len, full_square=not causal)
    block = parts["attention_proj"] + parts["ffn"] + parts["attention_scores"] + parts["attention_values"]
    return block / config.num_layers


def model_step_flops(config: ModelConfig, batch_size: int, seq_len: int, causal: bool) -> float:
    """Model FLOPs of a forward + backward (3x the forward's matmuls; attention at half the square
    when `causal`): what MFU divides by."""
    head = forward_flops_by_component(config, batch_size, seq_len)["lm_head"]
    return 3 * (config.num_layers * block_forward_flops(config, batch_size, seq_len, causal) + head)


def step_time_s(config: ModelConfig, batch_size: int, seq_len: int, causal: bool, rates: Rates) -> float:
    """Ideal time of a forward + backward at the device's peak."""
    return model_step_flops(config, batch_size, seq_len, causal) / rates.flops


def treatment_time_s(blocks: list[tuple[str, bool]], *, block_flops: float, costs: BlockBytes,
                     rates: Rates) -> dict[str, float]:
    """Seconds the treatments add to a step: recompute, rebuild, offload (exposed) and their sum."""
    forward = block_flops / rates.flops
    full = sum(kind == FULL for kind, _ in blocks)
    selective = sum(kind == SELECTIVE for kind, _ in blocks)
    offload = 0.0
    if any(offloaded for _, offloaded in blocks):
        if rates.host is None:
            raise ValueError(f"the catalog has no host-link bandwidth for {rates.device}: pass "
                             "--host-link-gbps (a measured copy bandwidth), or plan without offload")
        for i, (kind, offloaded) in enumerate(blocks):
            if not offloaded:
                continue
            transfer = costs.moved[kind] / rates.host
            offload += max(0.0, transfer - forward)  # to the host, beside the next block's forward
            after = blocks[i + 1] if i + 1 < len(blocks) else None
            if after is not None and after[1]:  # prefetched during the next block's backward
                window = (3 if after[0] == FULL else 2) * forward
                offload += max(0.0, transfer - window)
            else:
                offload += transfer
    times = {"recompute": full * forward, "rebuild": selective * costs.rebuild_traffic / rates.hbm,
             "offload": offload}
    times["extra"] = sum(times.values())
    return times
