"""One step of a model in a given mode and precision, with named phases.

The model, its batch, its loss and optionally its optimizer come from the point's model source
(`lmscope.sources`: a preset, a transformers config or a user's factory); the step is the same.

Shared by `bench`, `profile` and `memory`: they differ only in the probe around the steps.
`lmscope.workloads.cuda_graph_step` replays the same phases from CUDA graphs.
"""

from __future__ import annotations

import contextlib
import timeit
from collections.abc import Callable
from typing import Any

import torch

from lmscope.inputs.choices import check_choices
from lmscope.measure.ranges import phase
from lmscope.measure.timer import PhaseClock
from lmscope.records.provenance import cpu_model
from lmscope.workloads.compile_mode import GRAPHED, compile_model, first_calls
from lmscope.workloads.model_spec import ModelPointSpec

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available else cpu; an explicit cuda without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"lmscope runs on cpu or cuda, not {name!r}: use --device cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA GPU is visible: use --device cpu")
    return device


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """nullcontext for fp32, torch.autocast to bf16/fp16 otherwise."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=AUTOCAST_DTYPES[precision])


def check_model_choice(fast: bool, peer: str, attention: str) -> None:
    """Reject contradictory --fast / --peer / --attention combinations with how to fix them."""
    check_choices({"peer": peer})
    if fast and peer != "none":
        raise ValueError(f"--fast on and --peer {peer} are two different setups: pick one per point")
    if peer == "hf" and attention != "sdpa":
        raise ValueError("--peer hf runs transformers' Llama with SDPA attention: pass --attention sdpa")


def default_optimizer(
    model: torch.nn.Module, device: torch.device, capturable: bool
) -> torch.optim.Optimizer:
    """lmscope's AdamW (lr 1e-4, torch's defaults otherwise), for sources without their own.

    torch's fused AdamW on CUDA (capturable: the step count lives on the GPU, so a CUDA graph can
    replay the update) and the for-each one on CPU. (The fast path brings lmscope's FusedAdamW.)
    """
    fused = device.type == "cuda"
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, capturable=capturable)


class TrainStep:
    """The source's model, optimizer and batch on a device; calling it runs one step of `mode`."""

    def __init__(self, spec: ModelPointSpec, *, seed: int = 0, capturable: bool = False) -> None:
        self.spec = spec
        self.device = resolve_device(spec.device)
        if self.device.type == "cuda" and self.device.index is not None:
            # Triton kernels and CUDA-graph capture streams use the current device
            torch.cuda.set_device(self.device)
        torch.manual_seed(seed)
        self.source = spec.source()
        self.config = self.source.config
        self.fast = spec.fast
        self.built = self.source.build(self.device)
        self.model = self.built.model
        self.runnable = self.model
        """What a step calls: the model, or after `compile_warmup` its compiled form."""
        self.marks_cudagraph_steps = spec.compile == GRAPHED
        self.batch = self.built.make_batch(spec.batch_size, spec.context_length, self.device)
        self.optimizer = None
        if spec.mode == "train-step":
            make = self.built.optimizer
            self.optimizer = (make(self.model) if make is not None
                              else default_optimizer(self.model, self.device, capturable))
        use_scaler = spec.precision == "fp16" and spec.mode == "train-step"
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=use_scaler)
        self.last_loss: torch.Tensor | None = None

    def loss(self) -> torch.Tensor:
        """The source's loss (forward included) under the point's autocast."""
        with autocast_context(self.spec.precision, self.device):
            return self.built.loss(self.runnable, self.batch)

    def phases(self) -> list[tuple[str, Callable[[], None]]]:
        """The step's phases in order, as (name, run): forward, then backward and optimizer.

        Gradients are not cleared here (`__call__` does it; a CUDA-graph replay rewrites them).
        """
        if self.spec.mode == "forward":
            return [("forward", self._forward_only)]
        steps = [("forward", self._forward), ("backward", self._backward)]
        if self.optimizer is not None:
            steps.append(("optimizer", self._optimizer_step))
        return steps

    def __call__(self, clock: PhaseClock | None = None) -> None:
        """One step; phases are marked on `clock` (forward, backward, optimizer)."""
        clock = clock or _NullClock()
        if self.marks_cudagraph_steps:  # the previous step's CUDA graphs are a finished iteration
            torch.compiler.cudagraph_mark_step_begin()
        clock.start()
        if self.spec.mode != "forward":
            self.model.zero_grad(set_to_none=True)
        for name, run in self.phases():
            with phase(name):
                run()
            clock.mark(name)

    def _forward_only(self) -> None:
        with torch.no_grad(), autocast_context(self.spec.precision, self.device):
            self.built.run_forward(self.runnable, self.batch)

    def _forward(self) -> None:
        self.last_loss = self.loss()

    def _backward(self) -> None:
        loss, self.last_loss = self.last_loss, self.last_loss.detach()
        # nothing keeps this step's autograd graph (and its AccumulateGrad nodes, which remember
        # the stream they were made on) alive past its backward: the next step, or a CUDA-graph
        # capture on another stream, builds fresh ones instead of syncing with stale ones
        self.scaler.scale(loss).backward()
        if self.spec.optimizer_in_backward:
            # the updates started in the backward join it, so a CUDA-graph capture of this phase
            # holds them; the optimizer phase then only advances the step counts
            self.optimizer.wait_for_backward_updates()

    def _optimizer_step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def compile_warmup(self) -> float | None:
        """With torch.compile: compile the model (`lmscope.workloads.compile_mode`), run the steps
        that compile it (and record reduce-overhead's CUDA graphs); return their seconds."""
        if not self.spec.compile:
            return None
        begin = timeit.default_timer()
        self.runnable = compile_model(self.model, self.spec.compile, self.spec.compile_scope,
                                      self.built.blocks)
        for _ in range(first_calls(self.spec.compile)):
            self()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return timeit.default_timer() - begin

    def parameter_count(self) -> int:
        """Parameters of the model."""
        return sum(p.numel() for p in self.model.parameters())

    def model_facts(self) -> dict[str, Any]:
        """Which kind of source the model came from, its unit and its parameter count."""
        return {**self.source.facts(), "parameters": self.parameter_count()}


class _NullClock:
    def start(self) -> None: ...

    def mark(self, name: str) -> None: ...


def device_facts(device: torch.device) -> dict[str, Any]:
    """Name of the device the point ran on."""
    if device.type == "cuda":
        return {"device_type": "cuda", "device_name": torch.cuda.get_device_name(device)}
    return {"device_type": "cpu", "device_name": cpu_model()}
