"""One step of the Transformer LM in a given mode and precision, with named phases.

Shared by `bench`, `profile` and `memory`: they differ only in the probe around the steps.
`lmscope.workloads.cuda_graph_step` replays the same phases from CUDA graphs.
"""

from __future__ import annotations

import contextlib
import os
import platform
import timeit
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lmscope.config import ModelConfig
from lmscope.measure.ranges import phase
from lmscope.measure.timer import PhaseClock
from lmscope.model.transformer import TransformerLM
from lmscope.workloads.model_spec import ModelPointSpec

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PEERS = ("none", "hf")
"""Models other than lmscope's: none, or hf (transformers' Llama of the same sizes)."""


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
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}: choose one of {', '.join(PEERS)} "
                         "(the torch.compile peer is --compile on)")
    if fast and peer != "none":
        raise ValueError("--fast on runs lmscope's model, --peer hf transformers': pick one per point")
    if peer == "hf" and attention != "sdpa":
        raise ValueError("--peer hf runs transformers' Llama with SDPA attention: pass --attention sdpa")


FLASH_ON_CPU = ("--attention flash runs lmscope's Triton kernels, which need a CUDA GPU: on the CPU "
                "use --attention flash-torch (the same FlashAttention-2 algorithm in PyTorch)")


def build_model(spec: ModelPointSpec, config: ModelConfig, device: torch.device) -> torch.nn.Module:
    """The point's model: eager TransformerLM, FastTransformerLM (fast) or HF's Llama (peer hf)."""
    if getattr(spec, "peer", "none") == "hf":
        from lmscope.model.hf_peer import HFLlamaPeer

        return HFLlamaPeer(config)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # the tests' CPU interpreter
    if spec.fast:
        if device.type != "cuda" and not interpreted:
            raise ValueError("--fast on runs lmscope's Triton kernels, which need a CUDA GPU: "
                             "on the CPU drop --fast (or time --attention flash-torch)")
        from lmscope.model.fast_transformer import FastTransformerLM

        return FastTransformerLM(config, attention=spec.attention)
    if spec.attention == "flash" and device.type != "cuda" and not interpreted:
        raise ValueError(FLASH_ON_CPU)
    return TransformerLM(config, attention=spec.attention)


def build_optimizer(
    model: torch.nn.Module, spec: ModelPointSpec, device: torch.device, capturable: bool
) -> torch.optim.Optimizer:
    """AdamW (lr 1e-4, torch's defaults otherwise) for the point's model.

    The fast path with bf16/fp16 compute gets lmscope's FusedAdamW, which also writes the model's
    bf16 weight copies (and, with optimizer_in_backward, updates each weight inside the
    backward); every other point gets torch's fused AdamW on CUDA (capturable: the step count
    lives on the GPU, so a CUDA graph can replay the update) and the for-each one on CPU.
    """
    if spec.fast and spec.precision != "fp32":
        from lmscope.kernels.adamw import FusedAdamW

        model.shadow_weights(AUTOCAST_DTYPES[spec.precision])  # turns the bf16 copies on
        optimizer = FusedAdamW(model.parameters(), lr=1e-4, shadows=model.current_shadows,
                               step_in_backward=spec.optimizer_in_backward)
        if spec.optimizer_in_backward:  # the block matmuls hand their bf16 weight gradients over
            model.update_weights_in_backward(optimizer)
        return optimizer
    fused = device.type == "cuda"
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused, capturable=capturable)


class TrainStep:
    """Model, optimizer and a random batch on a device; calling it runs one step of `mode`."""

    def __init__(self, spec: ModelPointSpec, *, seed: int = 0, capturable: bool = False) -> None:
        self.spec = spec
        self.device = resolve_device(spec.device)
        if self.device.type == "cuda" and self.device.index is not None:
            # Triton kernels and CUDA-graph capture streams use the current device
            torch.cuda.set_device(self.device)
        torch.manual_seed(seed)
        self.config = spec.model_config()
        self.fast = spec.fast
        with self.device:  # build and initialize the weights on the device itself
            self.model = build_model(spec, self.config, self.device)
        self.runnable = torch.compile(self.model) if spec.compile else self.model
        shape = (spec.batch_size, spec.context_length)
        self.inputs = torch.randint(0, self.config.vocab_size, shape, device=self.device)
        self.targets = torch.randint(0, self.config.vocab_size, shape, device=self.device)
        self.optimizer = None
        if spec.mode == "train-step":
            self.optimizer = build_optimizer(self.model, spec, self.device, capturable)
        use_scaler = spec.precision == "fp16" and spec.mode == "train-step"
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=use_scaler)
        self.last_loss: torch.Tensor | None = None

    def loss(self) -> torch.Tensor:
        """Forward and cross-entropy (in fp32) under the point's autocast (fused when fast)."""
        with autocast_context(self.spec.precision, self.device):
            if self.fast:
                return self.runnable(self.inputs, self.targets)
            logits = self.runnable(self.inputs)
        return F.cross_entropy(logits.float().flatten(0, 1), self.targets.flatten())

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
        clock.start()
        if self.spec.mode != "forward":
            self.model.zero_grad(set_to_none=True)
        for name, run in self.phases():
            with phase(name):
                run()
            clock.mark(name)

    def _forward_only(self) -> None:
        with torch.no_grad(), autocast_context(self.spec.precision, self.device):
            self.runnable(self.inputs)

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
        """With torch.compile, run one step to trigger compilation and return its seconds."""
        if not self.spec.compile:
            return None
        begin = timeit.default_timer()
        self()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return timeit.default_timer() - begin

    def parameter_count(self) -> int:
        """Parameters of the model."""
        return sum(p.numel() for p in self.model.parameters())


class _NullClock:
    def start(self) -> None: ...

    def mark(self, name: str) -> None: ...


def device_facts(device: torch.device) -> dict[str, Any]:
    """Name of the device the point ran on."""
    if device.type == "cuda":
        return {"device_type": "cuda", "device_name": torch.cuda.get_device_name(device)}
    return {"device_type": "cpu", "device_name": platform.processor() or platform.machine()}
