"""AdamW in one Triton pass per parameter that also writes the parameter's low-precision copy.

API
    ``FusedAdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, shadows=None)``
    is a ``torch.optim.Optimizer`` with ``torch.optim.AdamW``'s math (decoupled weight decay,
    bias correction). ``shadows`` is a callable returning the model's current low-precision
    copies (``lmscope.kernels.shadow_copies.ShadowCopies``, e.g. the model's ``ShadowWeights``)
    or None: each step writes every updated parameter that has a copy there into that copy too
    (bf16) and marks it fresh, so a model that computes in bf16 reads current weights without
    casting them every forward.
    ``adamw_reference`` is the PyTorch math of one step; ``adamw_update_`` one update of one tensor
    (the kernel on CUDA, the reference elsewhere) for optimizers that keep their moments themselves
    (``lmscope.parallel.host_adamw``).

    ``step_in_backward=True`` updates each parameter during ``backward()``, the moment its gradient
    is accumulated (a post-accumulate-grad hook), on a side stream on CUDA, so the memory-bound
    update of the last layers overlaps the backward of the earlier ones. ``step()`` then waits for
    those updates (``wait_for_backward_updates``), updates any parameter whose gradient came
    another way, and advances the step counts. Each backward must be followed by one ``step()``
    (no gradient accumulation across backwards, no clipping between backward and step); a second
    backward before ``step()`` raises. The hooks hold the optimizer weakly and are removed when
    it is collected. On CUDA nothing may read a parameter (or its bf16 copy) between the moment
    its gradient is accumulated and ``step()`` -- e.g. a weight-norm log, or a second use of the
    weight through a detached path -- without ``wait_for_backward_updates()`` first: the update
    may be running on the side stream. ``update_with_gradients(params, grads)`` is the same
    update for gradients a backward computed itself and hands over instead of accumulating them
    into ``.grad`` (FastTransformerLM's matmuls: bf16 weight gradients, never stored in fp32).

Shapes and dtypes
    Parameters and gradients contiguous, any shape; float32 (the master weights), bf16 or fp16.
    The math runs in float32; moments have the parameter's dtype, as in torch.

Kernels
    one launch per parameter: reads param, grad, m, v (16 B per fp32 element), writes param, m, v
    and the shadow (12 + 2 B): the 28 B/param memory floor of AdamW plus the 2 B bf16 copy that a
    bf16 forward would otherwise read 4 and write 2 B for. The step counts live on the device (one
    ``_foreach_add_`` per group), so the whole step can be captured in a CUDA graph; lr, betas,
    eps and weight decay are then baked into the graph (a scheduler's changes do not reach
    replays). The kernels read the count before ``step()`` advances it and add one themselves
    (in step_in_backward mode the updates run during the backward, before that step()); a
    CUDA-graph capture of the backward must end with ``wait_for_backward_updates()`` so the
    side stream joins the capture.

Hardware
    Written for NVIDIA H100 (sm_90); memory bound. Per-parameter launches cost host time when run
    eagerly (~435 launches for xl); under CUDA graphs they replay for a few us each.

Caveats
    No amsgrad, maximize, foreach or sparse gradients. Under ``TRITON_INTERPRET=1`` (CPU, tests)
    the variable must be set before this module is imported.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence

import torch
import triton
import triton.language as tl

from lmscope.kernels.shadow_copies import ShadowCopies

__all__ = ["FusedAdamW", "adamw_reference", "adamw_update_", "check_hyperparameters"]

_BLOCK = 2048


def adamw_reference(
    param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, step: int,
    *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
) -> None:  # fmt: skip
    """One AdamW step in place, written as torch.optim.AdamW computes it."""
    param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias1, bias2 = 1 - beta1**step, 1 - beta2**step
    denom = (exp_avg_sq.sqrt() / bias2**0.5).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / bias1)


@triton.jit
def _adamw_kernel(
    P, G, M, V, SHADOW, STEP, n,
    lr, beta1, beta2, eps, weight_decay,
    HAS_SHADOW: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    step = tl.load(STEP).to(tl.float32) + 1.0  # the count advances after the update (step())
    p = tl.load(P + offsets, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + offsets, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M + offsets, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + offsets, mask=mask, other=0.0).to(tl.float32)
    p = p * (1.0 - lr * weight_decay)
    m = m + (1.0 - beta1) * (g - m)
    v = beta2 * v + (1.0 - beta2) * g * g
    bias1 = 1.0 - tl.exp2(step * tl.log2(beta1))
    bias2 = 1.0 - tl.exp2(step * tl.log2(beta2))
    denom = tl.sqrt(v) / tl.sqrt(bias2) + eps
    p = p - (lr / bias1) * (m / denom)
    tl.store(P + offsets, p.to(P.dtype.element_ty), mask=mask)
    tl.store(M + offsets, m.to(M.dtype.element_ty), mask=mask)
    tl.store(V + offsets, v.to(V.dtype.element_ty), mask=mask)
    if HAS_SHADOW:
        tl.store(SHADOW + offsets, p.to(SHADOW.dtype.element_ty), mask=mask)


def check_hyperparameters(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """Refuse AdamW hyperparameters torch's AdamW refuses, in one line."""
    if lr < 0 or eps < 0 or weight_decay < 0:
        raise ValueError(f"lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
    if not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must be in [0, 1), got {betas}")


def _remove_hooks(handles: list[torch.utils.hooks.RemovableHandle]) -> None:
    for handle in handles:
        handle.remove()


class FusedAdamW(torch.optim.Optimizer):
    """torch.optim.AdamW's update as one Triton kernel per parameter, optionally writing shadows."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        shadows: Callable[[], ShadowCopies | None] | None = None,
        step_in_backward: bool = False,
    ) -> None:
        check_hyperparameters(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.shadows = shadows
        # tells the copies' owner that this step keeps them current (shadow_copies.WRITES_SHADOW_WEIGHTS)
        self.writes_shadow_weights = shadows is not None
        self.step_in_backward = step_in_backward
        self._updated_in_backward: set[torch.Tensor] = set()
        self._handed_over: set[torch.Tensor] = set()  # of those, updated by update_with_gradients
        self._side_streams: dict[torch.device, torch.cuda.Stream] = {}
        self._pending: set[torch.cuda.Stream] = set()
        self._in_flight: list[torch.Tensor] = []  # gradients handed over, read on a side stream
        self._group_of: dict[torch.Tensor, dict] = {}
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        if step_in_backward:
            weakref.finalize(self, _remove_hooks, self._hooks)
            for group in self.param_groups:
                self._hook(group)

    def add_param_group(self, param_group: dict) -> None:
        """torch's add_param_group; with step_in_backward the new parameters are hooked too."""
        super().add_param_group(param_group)
        if getattr(self, "step_in_backward", False):
            self._hook(self.param_groups[-1])

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict; the in-backward updates then read the loaded groups."""
        super().load_state_dict(state_dict)
        self._group_of = {p: group for group in self.param_groups for p in group["params"]}

    def _hook(self, group: dict) -> None:
        # the hook holds the optimizer weakly: a parameter's hooks are invisible to Python's
        # garbage collector, so a strong reference would keep the model and optimizer alive
        optimizer = weakref.ref(self)

        def update(param: torch.Tensor) -> None:
            if (live := optimizer()) is None:
                return
            if param in live._handed_over:  # autograd calls the hook of such a weight too
                if param.grad is not None:
                    raise RuntimeError(
                        "a gradient reached .grad of a weight whose gradient this backward handed "
                        "to FusedAdamW.update_with_gradients (a second use of the weight, e.g. a "
                        "penalty on it, or a stale .grad: zero_grad(set_to_none=True)); it would be "
                        "dropped: turn the hand-over off (model.update_weights_in_backward(None))")
                return
            live._update_in_backward(param)

        for param in group["params"]:
            if param.requires_grad:
                self._group_of[param] = group
                self._hooks.append(param.register_post_accumulate_grad_hook(update))

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        """One AdamW step for every parameter with a gradient; returns closure's loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.wait_for_backward_updates()
        done, self._updated_in_backward = self._updated_in_backward, set()
        self._handed_over = set()
        for group in self.param_groups:
            # updated in this backward (even if its gradient was dropped since) or to update now
            params = [p for p in group["params"] if p in done or p.grad is not None]
            if not params:
                continue
            states = [self._state(p) for p in params]
            for param in params:  # before the count advances: the kernels read it and add one
                if param not in done:
                    self._update(param, group, param.grad)
            torch._foreach_add_([s["step"] for s in states], 1.0)
        return loss

    @torch.no_grad()
    def update_with_gradients(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> bool:
        """With step_in_backward: update `params` now from `grads`, which never reach ``.grad``.

        For a backward that computes weight gradients itself: `FastTransformerLM`'s matmuls hand
        theirs over in the compute dtype (bf16, rounded as autocast's eager model rounds them),
        so the update reads 2 B per element instead of the 4 B of an fp32 ``.grad``, and no fp32
        gradient is ever stored. The updates run as the hooks' do (side stream on CUDA); the
        gradients are kept alive until ``wait_for_backward_updates``. Returns False, doing
        nothing, unless this optimizer steps in backward and holds every one of `params`.
        """
        if not self.takes_gradients(params):
            return False
        for param, grad in zip(params, grads, strict=True):  # all checked before any update
            if grad.shape != param.shape:
                raise ValueError(f"a gradient of shape {tuple(grad.shape)} for a parameter of shape "
                                 f"{tuple(param.shape)}")
            if param in self._handed_over:
                raise RuntimeError(
                    "a weight's gradient was handed over twice in one backward (the weight feeds two "
                    "matmuls, or two forwards share one backward): the update takes one gradient per "
                    "weight and backward; call step() after each forward and backward, or turn the "
                    "hand-over off (model.update_weights_in_backward(None))")
        for param, grad in zip(params, grads, strict=True):
            self._update_in_backward(param, grad)
            self._handed_over.add(param)
        return True

    def takes_gradients(self, params: Sequence[torch.Tensor]) -> bool:
        """Whether `update_with_gradients` takes `params`: it steps in backward and holds them all."""
        return self.step_in_backward and all(p in self._group_of for p in params)

    @torch.no_grad()
    def _update_in_backward(self, param: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        """Update `param` from `grad` (default: its .grad, from the post-accumulate-grad hook) now,
        on the side stream when on CUDA."""
        if param in self._updated_in_backward:
            raise RuntimeError("FusedAdamW(step_in_backward=True) updates the parameters in every "
                               "backward: call step() after each backward (no gradient accumulation)")
        self._updated_in_backward.add(param)
        group = self._group_of[param]
        grad = param.grad if grad is None else grad
        if param.device.type != "cuda":
            self._update(param, group, grad)
            return
        side = self._side_streams.get(param.device)
        if side is None:
            side = self._side_streams[param.device] = torch.cuda.Stream(param.device)
        side.wait_stream(torch.cuda.current_stream(param.device))  # the gradient is written
        with torch.cuda.stream(side):
            self._update(param, group, grad)
        self._pending.add(side)
        self._in_flight.append(grad)  # read on the side stream: not freed before the join

    def wait_for_backward_updates(self) -> None:
        """Make the current stream wait for the updates started during backward (no host sync)."""
        for side in self._pending:
            torch.cuda.current_stream(side.device).wait_stream(side)
        self._pending.clear()
        self._in_flight.clear()

    def _update(self, param: torch.Tensor, group: dict, grad: torch.Tensor) -> None:
        """Launch the update of one parameter from `grad` (step number: its count, not yet
        advanced, plus one)."""
        if group.get("amsgrad") or group.get("maximize"):
            raise ValueError("FusedAdamW has no amsgrad or maximize (a state dict of "
                             "torch.optim.AdamW with them was loaded?): use torch.optim.AdamW")
        source = self.shadows() if self.shadows is not None else None
        shadow = source.views.get(param) if source is not None else None
        self._launch(param, grad, self._state(param), group, shadow)
        torch.autograd.graph.increment_version(param)  # written by a raw kernel
        if shadow is not None:
            source.mark_fresh(param)

    def _state(self, param: torch.Tensor) -> dict:
        if not param.is_contiguous():
            raise ValueError(f"FusedAdamW needs contiguous parameters, got strides {param.stride()}")
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.contiguous_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.contiguous_format)
        step = state["step"]
        if not torch.is_tensor(step) or step.device != param.device or step.dtype != torch.float32:
            # a loaded state dict (map_location="cpu", or torch.optim.AdamW's): the kernel reads
            # the count on the parameter's device
            state["step"] = torch.as_tensor(step, dtype=torch.float32).to(param.device)
        return state

    def _launch(
        self, param: torch.Tensor, grad: torch.Tensor, state: dict, group: dict,
        shadow: torch.Tensor | None,
    ) -> None:  # fmt: skip
        if grad.is_sparse:
            raise ValueError("FusedAdamW does not take sparse gradients")
        if grad.shape != param.shape:
            raise ValueError(f"a gradient of shape {tuple(grad.shape)} for a parameter of shape "
                             f"{tuple(param.shape)}")
        grad = grad if grad.is_contiguous() else grad.contiguous()
        if shadow is not None and (shadow.shape != param.shape or not shadow.is_contiguous()):
            raise ValueError(f"a shadow must be contiguous and shaped like its parameter "
                             f"{tuple(param.shape)}, got {tuple(shadow.shape)}")
        _launch_kernel(param, grad, state["exp_avg"], state["exp_avg_sq"], state["step"], group, shadow)


def _launch_kernel(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                   step: torch.Tensor, group: dict, shadow: torch.Tensor | None = None) -> None:
    """The kernel over one contiguous parameter (`step`: its count before this update, on its device)."""
    n = param.numel()
    if n == 0:
        return
    beta1, beta2 = group["betas"]
    _adamw_kernel[(triton.cdiv(n, _BLOCK),)](
        param, grad, exp_avg, exp_avg_sq, param if shadow is None else shadow,
        step, n, group["lr"], beta1, beta2, group["eps"], group["weight_decay"],
        HAS_SHADOW=shadow is not None, BLOCK=_BLOCK, num_warps=8,
    )  # fmt: skip


@torch.no_grad()
def adamw_update_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  step: torch.Tensor, group: dict) -> None:
    """One AdamW update of `param` in place from `grad` (any float dtype, read as float32), with the
    hyperparameters of a param group (lr, betas, eps, weight_decay) and `step` the 0-d float32
    count before it, on `param`'s device (not advanced here): on CUDA the fused kernel, on the CPU
    ``adamw_reference`` (no Triton interpreter needed). All tensors contiguous, shaped alike."""
    tensors = (param, grad, exp_avg, exp_avg_sq)
    if any(t.shape != param.shape or not t.is_contiguous() for t in tensors):
        raise ValueError("adamw_update_ takes contiguous tensors of one shape, got "
                         f"{[tuple(t.shape) for t in tensors]}")
    if param.is_cuda:
        _launch_kernel(param, grad, exp_avg, exp_avg_sq, step, group)
        torch.autograd.graph.increment_version(param)  # written by a raw kernel
        return
    beta1, beta2 = group["betas"]
    adamw_reference(param, grad.to(param.dtype), exp_avg, exp_avg_sq, int(step.item()) + 1, lr=group["lr"],
                    beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"])
