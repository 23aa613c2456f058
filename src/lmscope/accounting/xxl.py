"""FFN-only model configs (the "XXL" of the 4D-parallelism exercise) and its worked example.

An FFN-only model is `num_blocks` blocks of two bias-free linear layers, D -> F -> D, with no
activation function, attention, embeddings or head: the Scaling Book's "stack of MLP blocks"
approximation of a large Transformer. Each linear layer keeps its input for the weight gradient,
so a block saves D + F activations per token.

`worked_example` answers the exercise step by step, each number with the formula and the
substitution that produced it (Scaling Book, "Training": FSDP, tensor parallelism, mixed FSDP+TP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmscope.accounting.devices import CATALOG
from lmscope.accounting.parallelism import (
    Hardware,
    Mesh,
    ModelShape,
    PrecisionPlan,
    compute_bound_tokens,
    dtype_bytes,
    mixed_critical_batch,
    mixed_min_batch_per_device,
)


@dataclass(frozen=True, kw_only=True)
class FFNStack:
    """`num_blocks` blocks of Linear(D, F) then Linear(F, D), no biases, nothing else."""

    name: str
    """Config name."""
    d_model: int
    """D."""
    d_ff: int
    """F."""
    num_blocks: int
    """L."""

    def __post_init__(self) -> None:
        for field in ("d_model", "d_ff", "num_blocks"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{field} must be a positive integer, got {value!r}")

    @property
    def parameters(self) -> int:
        """2 D F L."""
        return 2 * self.d_model * self.d_ff * self.num_blocks

    @property
    def activation_elements_per_token(self) -> int:
        """Inputs of both linear layers of every block: L (D + F)."""
        return self.num_blocks * (self.d_model + self.d_ff)

    def shape(self) -> ModelShape:
        """The planner's view: forward FLOPs 2 x parameters per token, one TP block per layer."""
        return ModelShape(
            name=self.name, parameters=self.parameters, d_model=self.d_model, d_ff=self.d_ff,
            num_layers=self.num_blocks, forward_flops_per_token=2.0 * self.parameters,
            activation_elements_per_token=self.activation_elements_per_token, tp_blocks_per_layer=1,
        )


FFN_MODELS: dict[str, FFNStack] = {
    "xxl": FFNStack(name="xxl", d_model=16384, d_ff=53248, num_blocks=126),
}
"""Named FFN-only configs."""


def ffn_model(name: str) -> FFNStack:
    """The FFN-only config `name`; unknown names list the known ones."""
    if name.lower() not in FFN_MODELS:
        raise ValueError(f"unknown FFN-only model {name!r}: choose one of {', '.join(FFN_MODELS)}")
    return FFN_MODELS[name.lower()]


@dataclass(frozen=True, kw_only=True)
class ExampleInputs:
    """The figures the exercise fixes (Scaling Book numbers for TPU v5p)."""

    gpu_memory_gb: float = CATALOG["H100 SXM"].hbm_gb
    """Memory of the GPU that counts 'how many GPUs worth' (H100 80 GB)."""
    tpu_memory_gb: float = CATALOG["TPU v5p"].hbm_gb
    """Memory of the device FSDP must fit (TPU v5p, 95 GB)."""
    peak_flops: float = 4.6e14
    """C: TPU v5p bf16 FLOP/s as the Scaling Book rounds it."""
    bandwidth: float = 2 * 9e10
    """W_ici: bytes/s along one ICI axis, both directions (Scaling Book)."""
    fsdp: int = 16
    """X."""
    tp: int = 4
    """Y."""
    fsdp_axes: int = 2
    """M_X."""
    tp_axes: int = 1
    """M_Y."""
    tokens: tuple[int, ...] = (0, 1024, 4096)
    """Batch sizes (tokens) whose activations part (b) adds to the sharded state."""


@dataclass(frozen=True, kw_only=True)
class Step:
    """One number of the walk-through."""

    part: str
    """Which question it answers (a, b, c)."""
    quantity: str
    """What it is."""
    formula: str
    """The formula in symbols."""
    substitution: str
    """The formula with the numbers put in."""
    value: float | None
    """The result (None: no value satisfies the condition)."""
    unit: str
    """Unit of `value`."""
    result: str
    """The result as shown."""

    def as_record(self) -> dict[str, object]:
        """A flat row."""
        return {"part": self.part, "quantity": self.quantity, "formula": self.formula,
                "substitution": self.substitution, "result": self.result, "value": self.value,
                "unit": self.unit}


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def worked_example(model: FFNStack, inputs: ExampleInputs | None = None) -> list[Step]:
    """The XXL exercise: state memory, FSDP degree that fits, compute-bound batch for FSDP x TP."""
    inputs = inputs or ExampleInputs()
    d, f, layers, params = model.d_model, model.d_ff, model.num_blocks, model.parameters
    precision = PrecisionPlan()  # fp32 master, gradients and AdamW state; bf16 activations and comms
    per_param = precision.state_bytes_per_parameter
    act_bytes = dtype_bytes(precision.activations)
    state_bytes = per_param * params
    gpus = state_bytes / (inputs.gpu_memory_gb * 1e9)
    per_token = act_bytes * model.activation_elements_per_token
    hbm = inputs.tpu_memory_gb * 1e9
    steps = [
        Step(part="a", quantity="parameters P", formula="2 * D * F * L",
             substitution=f"2 * {d} * {f} * {layers}", value=params, unit="parameters",
             result=_n(params)),
        Step(part="a", quantity="bytes per parameter (fp32 master + gradient + AdamW m, v)",
             formula="4 + 4 + 2 * 4", substitution="4 + 4 + 8", value=per_param, unit="bytes",
             result=str(per_param)),
        Step(part="a", quantity="master weights + accumulated gradients + optimizer state",
             formula="16 * P / 1e9", substitution=f"16 * {params} / 1e9", value=state_bytes / 1e9,
             unit="GB", result=f"{_n(state_bytes / 1e9, 2)} GB"),
        Step(part="a", quantity=f"{inputs.gpu_memory_gb:g} GB GPUs worth of that memory",
             formula=f"16 P / {inputs.gpu_memory_gb:g} GB",
             substitution=f"{_n(state_bytes / 1e9, 2)} / {inputs.gpu_memory_gb:g}", value=gpus,
             unit="GPUs", result=f"{gpus:.2f} -> {math.ceil(gpus)} GPUs"),
        Step(part="a", quantity="bf16 activations saved for backward, per token",
             formula="2 bytes * L * (D + F)", substitution=f"2 * {layers} * ({d} + {f})",
             value=per_token, unit="bytes/token", result=f"{_n(per_token)} B = {per_token / 1e6:.2f} MB"),
    ]
    steps += _fsdp_fit_steps(state_bytes, per_token, hbm, inputs)
    steps += _compute_bound_steps(model, inputs)
    return steps


def _fsdp_fit_steps(state_bytes: float, per_token: float, hbm: float, inputs: ExampleInputs) -> list[Step]:
    """(b): states and half the activations sharded N ways: M(N) = (16P + A/2)/N + A/2 < HBM."""
    hbm_gb = inputs.tpu_memory_gb
    steps = [Step(
        part="b", quantity="memory per device with N_FSDP shards (A: activations of the batch)",
        formula="M(N) = (16 P + A/2) / N + A/2",
        substitution=f"({_n(state_bytes / 1e9, 2)} GB + A/2) / N + A/2", value=None, unit="bytes",
        result="the sharded half divides by N; the other half of the activations stays whole",
    )]
    for tokens in inputs.tokens:
        half = per_token * tokens / 2
        label = f"N_FSDP to fit {hbm_gb:g} GB with the activations of {_n(tokens)} tokens"
        formula = "ceil((16 P + A/2) / (HBM - A/2)), A = tokens * bytes/token"
        substitution = (f"ceil(({_n(state_bytes / 1e9, 2)} + {half / 1e9:.2f}) / "
                        f"({hbm_gb:g} - {half / 1e9:.2f}))")
        if half >= hbm:
            steps.append(Step(part="b", quantity=label, formula=formula, substitution=substitution,
                              value=None, unit="devices", result="none: A/2 alone exceeds the device"))
            continue
        shards = math.ceil((state_bytes + half) / (hbm - half))
        per_device = (state_bytes + half) / shards + half
        steps.append(Step(part="b", quantity=label, formula=formula, substitution=substitution,
                          value=shards, unit="devices",
                          result=f"{shards} devices ({per_device / 1e9:.3f} GB each)"))
    most = 2 * hbm / per_token
    steps.append(Step(part="b", quantity="largest batch any N_FSDP fits (A/2 < HBM)",
                      formula="2 * HBM / (bytes/token)", substitution=f"2 * {hbm_gb:g}e9 / {_n(per_token)}",
                      value=most, unit="tokens", result=f"{_n(most)} tokens"))
    return steps


def _compute_bound_steps(model: FFNStack, inputs: ExampleInputs) -> list[Step]:
    """(c): forward pass, mixed FSDP (X) + TP (Y): T_FSDP + T_MP < T_math."""
    c, w, x, y = inputs.peak_flops, inputs.bandwidth, inputs.fsdp, inputs.tp
    mx, my, f = inputs.fsdp_axes, inputs.tp_axes, model.d_ff
    n = x * y
    alpha = c / w
    batch = mixed_critical_batch(f, x, y, c, w, mx, my)
    steps = [
        Step(part="c", quantity="ICI arithmetic intensity alpha", formula="C / W_ici",
             substitution=f"{c:g} / {w:g}", value=alpha, unit="FLOP/byte", result=f"{alpha:,.1f}"),
        Step(part="c", quantity="condition (forward, per layer; D cancels)",
             formula="4DF/(Y W M_X) + 4BD/(X W M_Y) < 4BDF/(N C),  N = X Y",
             substitution=f"X={x}, Y={y}, N={n}, M_X={mx}, M_Y={my}, F={f}", value=None, unit="",
             result="B > [F/(Y W M_X)] / [F/(N C) - 1/(X W M_Y)]"),
    ]
    if batch is None:
        steps.append(Step(part="c", quantity="compute-bound global batch", formula="-", substitution="-",
                          value=None, unit="tokens", result="none: TP traffic alone outgrows the math"))
        return steps
    substitution = f"[{f}/({y}*{w:g}*{mx})] / [{f}/({n}*{c:g}) - 1/({x}*{w:g}*{my})]"
    steps += [
        Step(part="c", quantity="compute-bound global batch B",
             formula="[F/(Y W M_X)] / [F/(N C) - 1/(X W M_Y)]", substitution=substitution,
             value=batch, unit="tokens", result=f"{_n(batch)} tokens"),
        Step(part="c", quantity=f"compute-bound per-device batch, X={x} FSDP x Y={y} TP",
             formula="B / N", substitution=f"{_n(batch, 1)} / {n}", value=batch / n,
             unit="tokens/device", result=f"{batch / n:,.1f} tokens per device"),
    ]
    ringed = compute_bound_tokens(
        model.shape(), Mesh(fsdp=x, tp=y, fsdp_axes=mx, tp_axes=my), PrecisionPlan(),
        Hardware(name="TPU v5p", peak_flops=c, axis_bandwidth=w), phases=("forward",), ring_factors=True,
    )
    if ringed is not None:
        steps.append(Step(
            part="c", quantity="same, with ring factors (X-1)/X and (Y-1)/Y (lmscope's planner)",
            formula="(X-1)/X * 4DF/(Y W M_X) + (Y-1)/Y * 4BD/(X W M_Y) < 4BDF/(N C)",
            substitution=f"ring factors {x - 1}/{x} and {y - 1}/{y}",
            value=ringed, unit="tokens",
            result=f"{_n(ringed)} tokens = {ringed / n:,.1f} per device"))
    best = mixed_min_batch_per_device(f, c, w, mx, my)
    steps.append(Step(
        part="c", quantity=f"Book's floor over all FSDP x TP splits of N={n} (best X = 2 alpha N/(F M_Y))",
        formula="B/N > 4 alpha^2 / (F M_X M_Y)", substitution=f"4 * {alpha:,.1f}^2 / ({f} * {mx} * {my})",
        value=best, unit="tokens/device",
        result=f"{best:,.1f} per device = {_n(best * n)} global, at X = {2 * alpha * n / (f * my):.1f}"))
    return steps
