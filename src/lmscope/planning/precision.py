"""What low precision does: sums kept in fp16/bf16, and the dtypes autocast gives each tensor.

`accumulate` adds the same small value many times with accumulators and addends of different
dtypes (the mixed_precision_accumulation exercise): a low-precision accumulator stalls once the
value falls below half the spacing of the representable numbers near the running sum, which is
why reductions (matmul accumulators, norms, losses, gradient sums) stay in fp32.

`autocast_dtypes` runs a model forward and backward under torch.autocast and records, from forward
hooks on named submodules, the dtype of every output, plus the parameters inside the context, the
loss and the gradients (the benchmarking_mixed_precision exercise, on CPU or GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmscope.inputs.limits import MAX_STEPS
from lmscope.workloads.train_step import resolve_device

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
AUTOCAST_DTYPES = ("fp16", "bf16")


@dataclass(frozen=True)
class Accumulation:
    """An accumulator dtype, the dtype of what is added, and how the addend meets the accumulator."""

    accumulator: str
    addend: str
    cast: str
    """'none' (same dtype), 'implicit' (in-place add promotes) or 'explicit' (.to(accumulator))."""


ACCUMULATIONS = (
    Accumulation("fp32", "fp32", "none"),
    Accumulation("fp16", "fp16", "none"),
    Accumulation("bf16", "bf16", "none"),
    Accumulation("fp32", "fp16", "implicit"),
    Accumulation("fp32", "fp16", "explicit"),
    Accumulation("fp32", "bf16", "implicit"),
)
"""The variants `accumulate` runs."""


def spacing(dtype: str, value: float) -> float:
    """Distance between `value` and the next representable number of `dtype` above it (its ulp)."""
    if value == 0:
        return torch.finfo(TORCH_DTYPES[dtype]).tiny
    return torch.finfo(TORCH_DTYPES[dtype]).eps * 2.0 ** math.floor(math.log2(abs(value)))


def accumulate(count: int, value: float = 0.01, device: str = "cpu") -> list[dict[str, Any]]:
    """Add `value` `count` times in every variant of ACCUMULATIONS; one record per variant."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"count must be a positive integer, got {count!r}: pass --count N")
    if not math.isfinite(value):
        raise ValueError(f"value must be a finite number, got {value!r}: pass --value 0.01")
    if count > MAX_STEPS:
        raise ValueError(f"count {count} is too many additions: at most {MAX_STEPS:,} (each is a "
                         "separate add on the device): pass a smaller --count")
    device = str(resolve_device(device))
    exact = float(Fraction(str(value)) * count)
    records = []
    for variant in ACCUMULATIONS:
        total = torch.zeros((), dtype=TORCH_DTYPES[variant.accumulator], device=device)
        addend = torch.tensor(value, dtype=TORCH_DTYPES[variant.addend], device=device)
        if variant.cast == "explicit":
            for _ in range(count):
                total += addend.to(total.dtype)
        else:
            for _ in range(count):
                total += addend
        result = total.item()
        records.append({
            "count": count, "value": value, "accumulator": variant.accumulator,
            "addend": variant.addend, "cast": variant.cast, "result": result, "exact": exact,
            "abs_error": abs(result - exact), "rel_error_pct": 100 * abs(result - exact) / abs(exact)
            if exact else None,
            "addend_as_stored": addend.item(),
            "spacing_at_result": spacing(variant.accumulator, result),
        })
    return records


class ToyModel(nn.Module):
    """fc1 -> relu -> layer norm -> fc2, no biases in the linears (the CS336 ToyModel)."""

    def __init__(self, in_features: int, out_features: int, hidden: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden, bias=False)
        self.ln = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.relu(self.fc1(x))))


def _shown(name: str) -> bool:
    """Top-level modules and the first block only (the others repeat it)."""
    parts = name.split(".")
    return not (parts[0] == "layers" and len(parts) > 1 and parts[1] != "0")


def _build(model: str, device: torch.device, seed: int) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model and a random (inputs, targets) batch on `device`."""
    generator = torch.Generator().manual_seed(seed)
    if model == "toy":
        in_features, out_features, rows = 17, 5, 7
        with device:
            net = ToyModel(in_features, out_features)
        inputs = torch.randn(rows, in_features, generator=generator)
        targets = torch.randint(0, out_features, (rows,), generator=generator)
        return net, inputs.to(device), targets.to(device)
    from lmscope.config import preset
    from lmscope.model.transformer import TransformerLM

    config = preset(model, context_length=32)
    torch.manual_seed(seed)
    with device:
        net = TransformerLM(config)
    shape = (2, config.context_length)
    inputs = torch.randint(0, config.vocab_size, shape, generator=generator)
    targets = torch.randint(0, config.vocab_size, shape, generator=generator)
    return net, inputs.to(device), targets.to(device)


def autocast_dtypes(model: str, dtype: str, device: str = "cpu", seed: int = 0) -> list[dict[str, Any]]:
    """Dtypes of parameters, submodule outputs, loss and gradients of one autocast step of `model`.

    `model` is 'toy' or a Transformer preset name (built with context 32 and batch 2); for the
    Transformer only the top-level modules and the first block are listed.
    """
    if dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"unknown autocast dtype {dtype!r}: choose one of {', '.join(AUTOCAST_DTYPES)}")
    target = torch.device(device)
    net, inputs, targets = _build(model, target, seed)
    outputs: dict[str, torch.dtype] = {}

    def record(name: str) -> Any:
        def hook(_module: nn.Module, _inputs: Any, out: Any) -> None:
            if isinstance(out, torch.Tensor):
                outputs.setdefault(name, out.dtype)  # first call: a shared module reports once
        return hook

    handles = [module.register_forward_hook(record(name))
               for name, module in net.named_modules() if name and _shown(name)]
    try:
        with torch.autocast(device_type=target.type, dtype=TORCH_DTYPES[dtype]):
            inside = {name: p.dtype for name, p in net.named_parameters() if _shown(name)}
            logits = net(inputs)
            loss = F.cross_entropy(logits.flatten(0, -2), targets.flatten())
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    base = {"model": model, "autocast": dtype, "device": target.type}
    rows = [{**base, "kind": "parameter (inside autocast)", "name": n, "dtype": _short(d)}
            for n, d in inside.items()]
    rows += [{**base, "kind": "output", "name": n, "dtype": _short(d)} for n, d in outputs.items()]
    rows.append({**base, "kind": "output", "name": "logits (model output)", "dtype": _short(logits.dtype)})
    rows.append({**base, "kind": "loss", "name": "cross_entropy", "dtype": _short(loss.dtype)})
    rows += [{**base, "kind": "gradient", "name": n, "dtype": _short(p.grad.dtype)}
             for n, p in net.named_parameters() if _shown(n) and p.grad is not None]
    return rows


def _short(dtype: torch.dtype) -> str:
    """torch.float16 -> fp16."""
    return {v: k for k, v in TORCH_DTYPES.items()}.get(dtype, str(dtype).removeprefix("torch."))
