"""A training step sharded over a device mesh: memory per device, bytes moved, compute-bound batch.

Follows "How to Scale Your Model" (the TPU Scaling Book, jax-ml.github.io/scaling-book): collective
costs from "Sharded Matrices", FLOPs and memory from "Transformer Math", and when each scheme turns
communication bound from "Training". Notation as there: D d_model, F d_ff, L layers, B tokens in the
global batch, X the FSDP degree, Y the TP degree, N devices, C peak FLOP/s per device, W the bytes/s
a collective moves per device along one mesh axis, M_X / M_Y the mesh axes that FSDP / TP span.

The step model (per device, forward then backward at 2x the forward FLOPs):

* DP (degree dp): AllReduce of the gradients in the backward pass, 2 (n-1)/n x the gradient bytes
  of the device's shard.
* FSDP (X): AllGather of the weights before the forward and again before the backward,
  ReduceScatter of the gradients after it, (X-1)/X x the weight bytes of the FSDP group each.
* TP (Y): per layer and pass, an AllGather of the input and a ReduceScatter of the output of each
  sharded sub-block, (Y-1)/Y x the activation bytes of the replica's tokens each; activations are
  sharded Y ways (Megatron sharding with sequence parallelism).
* PP (S): a stage sends its boundary activations forward and their gradients back; it holds L/S
  layers and, all micro-batches in flight (GPipe), their activations; the bubble is ignored.

Within a pass, communication overlaps the math; collectives on different axes add up (the Book's
T_FSDP + T_MP = T_math). The Book drops the ring factors (n-1)/n; `ring_factors=False` does too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmscope.accounting.devices import lookup

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes per element of the dtypes a plan may name."""

PHASES = ("forward", "backward")


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of `dtype`; unknown names list the known ones."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


MAX_DEGREE = 2**20
"""Largest degree of a mesh axis: a million devices, more than any machine has."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What the planner needs of a model: sizes for memory, FLOPs and per-layer communication."""

    name: str
    """Model name shown in tables."""
    parameters: int
    """All trainable parameters (they set the memory of weights, gradients and optimizer state)."""
    d_model: int
    """D: width of the activations TP gathers and PP sends."""
    d_ff: int
    """F: inner width of the FFN (TP shards it)."""
    num_layers: int
    """L: layers (PP splits them)."""
    forward_flops_per_token: float
    """Matmul FLOPs of the forward pass per token."""
    activation_elements_per_token: float
    """Elements saved for the backward pass per token, whole model, no checkpointing."""
    tp_blocks_per_layer: int = 1
    """Sub-blocks per layer that TP shards (MLP only: 1; attention and MLP: 2)."""
    num_heads: int | None = None
    """Attention heads (TP gives each shard whole heads); None for an FFN-only model."""


def mesh_problem(shape: ModelShape, mesh: Mesh) -> str | None:
    """Why `mesh` cannot shard `shape` (a TP degree that splits a head or d_ff unevenly, more
    pipeline stages than layers), or None when it can."""
    if shape.num_heads is not None and shape.num_heads % mesh.tp:
        return (f"tensor parallelism {mesh.tp} does not divide the {shape.num_heads} heads of "
                f"{shape.name} (each shard holds whole heads)")
    if shape.d_ff % mesh.tp:
        return f"tensor parallelism {mesh.tp} does not divide d_ff {shape.d_ff} of {shape.name}"
    if mesh.pp > shape.num_layers:
        return f"{mesh.pp} pipeline stages are more than the {shape.num_layers} layers of {shape.name}"
    return None


def _divisors(n: int, most: int = 12) -> str:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return ", ".join(map(str, divisors[:most])) + (", ..." if len(divisors) > most else "")


def check_mesh(shape: ModelShape, mesh: Mesh) -> None:
    """ValueError saying why `mesh` cannot shard `shape`, with the degrees that can."""
    problem = mesh_problem(shape, mesh)
    if problem is None:
        return
    if mesh.pp > shape.num_layers:
        raise ValueError(f"{problem}: pass --pp {shape.num_layers} or fewer")
    whole = math.gcd(shape.num_heads or shape.d_ff, shape.d_ff)
    raise ValueError(f"{problem}: pass --tp among {_divisors(whole)}")


@dataclass(frozen=True, kw_only=True)
class PrecisionPlan:
    """The dtype of each kind of tensor in a mixed-precision step."""

    master: str = "fp32"
    """Master weights the optimizer updates."""
    gradients: str = "fp32"
    """Accumulated gradients."""
    optimizer: str = "fp32"
    """Each optimizer state tensor."""
    optimizer_states: int = 2
    """State tensors per parameter (AdamW: first and second moment)."""
    activations: str = "bf16"
    """Activations saved for the backward pass."""
    communication: str = "bf16"
    """What collectives send (weights, gradients, activations)."""

    def __post_init__(self) -> None:
        for name in ("master", "gradients", "optimizer", "activations", "communication"):
            dtype_bytes(getattr(self, name))
        if not isinstance(self.optimizer_states, int) or self.optimizer_states < 0:
            raise ValueError(f"optimizer_states must be 0 or more, got {self.optimizer_states!r}")

    @property
    def state_bytes_per_parameter(self) -> int:
        """Bytes of master weight, gradient and optimizer state per parameter (16 for fp32 AdamW)."""
        return (dtype_bytes(self.master) + dtype_bytes(self.gradients)
                + self.optimizer_states * dtype_bytes(self.optimizer))


@dataclass(frozen=True, kw_only=True)
class Mesh:
    """Degrees of data, fully sharded data, tensor and pipeline parallelism, and their mesh axes."""

    dp: int = 1
    """Data-parallel replicas (weights replicated, gradients all-reduced)."""
    fsdp: int = 1
    """X: FSDP / ZeRO-3 shards (batch and weights, optimizer state sharded)."""
    tp: int = 1
    """Y: tensor-parallel shards (d_ff of the weights, d_model of the activations)."""
    pp: int = 1
    """Pipeline stages (layers)."""
    dp_axes: int = 1
    """Physical mesh axes DP spans; each adds a W of bandwidth."""
    fsdp_axes: int = 1
    """M_X: physical mesh axes FSDP spans."""
    tp_axes: int = 1
    """M_Y: physical mesh axes TP spans."""

    def __post_init__(self) -> None:
        for name in ("dp", "fsdp", "tp", "pp", "dp_axes", "fsdp_axes", "tp_axes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DEGREE:
                raise ValueError(f"{name} must be an integer from 1 to {MAX_DEGREE:,} (devices in a mesh), "
                                 f"got {value!r}: pass --{name.replace('_', '-')} N")

    @property
    def devices(self) -> int:
        """N: devices in the mesh."""
        return self.dp * self.fsdp * self.tp * self.pp

    @property
    def state_shards(self) -> int:
        """Ways the weights, gradients and optimizer state are split (FSDP x TP x PP)."""
        return self.fsdp * self.tp * self.pp

    @property
    def batch_shards(self) -> int:
        """Ways the batch is split (DP x FSDP)."""
        return self.dp * self.fsdp


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """The per-device figures the plan needs."""

    name: str
    """Device name."""
    peak_flops: float
    """C: dense peak FLOP/s at the compute dtype."""
    axis_bandwidth: float
    """W: bytes/s a collective moves per device along one mesh axis."""
    memory_bytes: float | None = None
    """Device memory in bytes, when known."""


def hardware(
    device_name: str, dtype: str, *, peak_tflops: float | None = None, bandwidth_gbps: float | None = None
) -> Hardware:
    """C, W and memory of a catalogued device (explicit values override, and are required otherwise)."""
    spec = lookup(device_name)
    peak = peak_tflops if peak_tflops is not None else (spec.peak(dtype) if spec else None)
    bandwidth = bandwidth_gbps if bandwidth_gbps is not None else (spec.axis_gbps if spec else None)
    if peak is None or bandwidth is None:
        what, flag = (f"{dtype} peak", "--peak-tflops") if peak is None else ("bandwidth", "--bandwidth-gbps")
        raise ValueError(
            f"device {device_name!r} has no catalogued {what}: pass {flag}, or a catalogued device "
            "(H100 SXM, H100 PCIe, H200, A100, B200, TPU v5p)"
        )
    if not all(math.isfinite(v) and v > 0 for v in (peak, bandwidth)):
        raise ValueError(f"peak TFLOP/s and bandwidth must be positive finite numbers, got {peak!r} and "
                         f"{bandwidth!r}: pass --peak-tflops and --bandwidth-gbps")
    return Hardware(name=spec.name if spec else device_name, peak_flops=peak * 1e12,
                    axis_bandwidth=bandwidth * 1e9,
                    memory_bytes=spec.hbm_gb * 1e9 if spec else None)


def memory_per_device(
    shape: ModelShape, mesh: Mesh, precision: PrecisionPlan, tokens: float
) -> dict[str, float]:
    """Bytes per device of master weights, gradients, optimizer state and activations (and total)."""
    params = shape.parameters / mesh.state_shards
    tokens_per_device = tokens / mesh.batch_shards / (mesh.tp * mesh.pp)
    memory = {
        "master_weights": params * dtype_bytes(precision.master),
        "gradients": params * dtype_bytes(precision.gradients),
        "optimizer_state": params * precision.optimizer_states * dtype_bytes(precision.optimizer),
        "activations": shape.activation_elements_per_token * tokens_per_device
        * dtype_bytes(precision.activations),
    }
    memory["total"] = sum(memory.values())
    return memory


@dataclass(frozen=True, kw_only=True)
class AxisTraffic:
    """What one parallelism axis moves per device in one step."""

    axis: str
    """dp, fsdp, tp or pp."""
    collectives: str
    """Which collectives, on what."""
    forward_bytes: float
    """Bytes a device sends in the forward pass."""
    backward_bytes: float
    """Bytes a device sends in the backward pass."""
    bandwidth: float
    """Bytes/s along this axis (W times its mesh axes)."""

    @property
    def step_bytes(self) -> float:
        """Bytes a device sends in the whole step."""
        return self.forward_bytes + self.backward_bytes

    def seconds(self, phase: str) -> float:
        """Time of this axis's collectives in `phase` at its bandwidth."""
        return (self.forward_bytes if phase == "forward" else self.backward_bytes) / self.bandwidth


def ring_factor(n: int, exact: bool = True) -> float:
    """Share of an n-way collective's array a device sends: (n-1)/n, or 1 as the Book rounds it."""
    if n == 1:
        return 0.0
    return (n - 1) / n if exact else 1.0


def traffic(
    shape: ModelShape,
    mesh: Mesh,
    precision: PrecisionPlan,
    tokens: float,
    hw: Hardware,
    *,
    ring_factors: bool = True,
) -> list[AxisTraffic]:
    """Bytes each parallel axis moves per device in one step of a global batch of `tokens` tokens."""
    comm = dtype_bytes(precision.communication)
    boundary = tokens / mesh.batch_shards * shape.d_model * comm  # one replica's activations
    out = []
    if mesh.dp > 1:
        gradients = shape.parameters / mesh.state_shards * comm
        out.append(AxisTraffic(
            axis="dp", collectives="AllReduce(gradients)", forward_bytes=0.0,
            backward_bytes=2 * ring_factor(mesh.dp, ring_factors) * gradients,
            bandwidth=hw.axis_bandwidth * mesh.dp_axes))
    if mesh.fsdp > 1:
        weights = shape.parameters / (mesh.tp * mesh.pp) * comm
        share = ring_factor(mesh.fsdp, ring_factors) * weights
        out.append(AxisTraffic(
            axis="fsdp", collectives="AllGather(weights) fwd+bwd, ReduceScatter(gradients)",
            forward_bytes=share, backward_bytes=2 * share,
            bandwidth=hw.axis_bandwidth * mesh.fsdp_axes))
    if mesh.tp > 1:
        per_pass = (2 * shape.tp_blocks_per_layer * shape.num_layers / mesh.pp
                    * ring_factor(mesh.tp, ring_factors) * boundary)
        out.append(AxisTraffic(
            axis="tp", collectives="AllGather(input) + ReduceScatter(output) per block",
            forward_bytes=per_pass, backward_bytes=per_pass,
            bandwidth=hw.axis_bandwidth * mesh.tp_axes))
    if mesh.pp > 1:
        out.append(AxisTraffic(
            axis="pp", collectives="Send(activations) fwd, Send(activation gradients) bwd",
            forward_bytes=boundary, backward_bytes=boundary, bandwidth=hw.axis_bandwidth))
    return out


def math_seconds(shape: ModelShape, mesh: Mesh, tokens: float, hw: Hardware, phase: str) -> float:
    """Matmul time per device of one pass at peak: forward FLOPs (x2 backward) / N / C."""
    factor = {"forward": 1.0, "backward": 2.0}[phase]
    return factor * shape.forward_flops_per_token * tokens / mesh.devices / hw.peak_flops


def comm_seconds(
    shape: ModelShape, mesh: Mesh, precision: PrecisionPlan, tokens: float, hw: Hardware, phase: str,
    *, ring_factors: bool = True,
) -> float:
    """Communication time per device of one pass, the axes one after another."""
    return sum(t.seconds(phase) for t in traffic(shape, mesh, precision, tokens, hw,
                                                 ring_factors=ring_factors))


def compute_bound_tokens(
    shape: ModelShape,
    mesh: Mesh,
    precision: PrecisionPlan,
    hw: Hardware,
    *,
    phases: tuple[str, ...] = PHASES,
    ring_factors: bool = True,
) -> float | None:
    """Smallest global batch (tokens) from which the math of each pass hides its communication.

    Communication time is affine in the batch (weights: fixed; activations: per token) and math is
    linear, so each pass has one threshold a / (m - b); None when communication grows as fast as
    the math (TP too wide for F), 0 when nothing is communicated.
    """
    thresholds = [0.0]
    for phase in phases:
        fixed, at_one = (comm_seconds(shape, mesh, precision, tokens, hw, phase, ring_factors=ring_factors)
                         for tokens in (0.0, 1.0))
        per_token = at_one - fixed
        math_per_token = math_seconds(shape, mesh, 1.0, hw, phase)
        if fixed == 0 and per_token <= math_per_token:
            continue
        if per_token >= math_per_token:
            return None
        thresholds.append(fixed / (math_per_token - per_token))
    return max(thresholds)


# Closed forms of the Scaling Book's "Training" section (ring factors dropped, forward pass).


def dp_critical_batch(peak_flops: float, bandwidth: float, axes: int = 1) -> float:
    """Per-device batch B/X above which DP or FSDP is compute bound: C / (W M)."""
    return peak_flops / (bandwidth * axes)


def tp_max_degree(d_ff: int, peak_flops: float, bandwidth: float, axes: int = 1) -> float:
    """TP degree Y below which tensor parallelism is compute bound: M_Y F W / C."""
    return axes * d_ff * bandwidth / peak_flops


def mixed_critical_batch(
    d_ff: int, fsdp: int, tp: int, peak_flops: float, bandwidth: float, fsdp_axes: int, tp_axes: int
) -> float | None:
    """Global batch B above which mixed FSDP (X) + TP (Y) is compute bound, None if never.

    From T_FSDP + T_MP < T_math per layer: 4DF/(Y W M_X) + 4BD/(X W M_Y) < 4BDF/(N C), N = X Y,
    so B > [F/(Y W M_X)] / [F/(N C) - 1/(X W M_Y)].
    """
    devices = fsdp * tp
    margin = d_ff / (devices * peak_flops) - 1 / (fsdp * bandwidth * tp_axes)
    if margin <= 0:
        return None
    return d_ff / (tp * bandwidth * fsdp_axes) / margin


def mixed_min_batch_per_device(
    d_ff: int, peak_flops: float, bandwidth: float, fsdp_axes: int, tp_axes: int
) -> float:
    """Smallest per-device batch any FSDP x TP split of N devices keeps compute bound: 4 a^2/(F M_X M_Y).

    a = C / W; where the quadratic in X of the Book has a double root, X = 2 a N / (F M_Y).
    """
    alpha = peak_flops / bandwidth
    return 4 * alpha**2 / (d_ff * fsdp_axes * tp_axes)
