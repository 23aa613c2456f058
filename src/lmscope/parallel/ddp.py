"""Data-parallel wrappers, from the simplest to the overlapped and bucketed kind.

Common contract: wrap any nn.Module in an initialized process group; parameters and buffers
are broadcast from rank 0 at construction (frozen ones too, so that the replicas agree);
`forward` passes through to `.module`; after backward, `finish_gradient_synchronization()`
returns once every gradient holds the mean over ranks (call it before the optimizer step).
Only parameters with requires_grad=True are communicated, each once even when tied (shared
by several modules); every one of them must receive a gradient in every step, once (one
backward per step). `settings` says how the wrapper communicates (recorded in ddp rows).

Averaging: with NCCL the all-reduce averages itself (`ReduceOp.AVG`), so no pass over the
gradients is spent on it; gloo has no AVG, so the gradients are divided by the world size on
the way (fused with a copy where there is one, else one in-place pass).

* `NaiveDDP`: one blocking all-reduce per parameter after backward.
* `FlatDDP`: one all-reduce of all gradients flattened into one buffer, after backward.
* `OverlapDDP`: each gradient is all-reduced asynchronously, in place, as soon as it is
  accumulated (`register_post_accumulate_grad_hook`), overlapping communication with backward.
* `BucketedDDP`: gradients grouped, in reverse parameter order (about the order backward
  produces them), into buckets of at most `bucket_size_mb` MiB (2**20 bytes, the unit of
  PyTorch's bucket_cap_mb), each bucket one flat buffer. A gradient is copied into its slot
  (one pass) and `.grad` becomes a view of the slot, so that the averaged buffer is the
  gradient: nothing is copied back. A `.grad` that already is the view (zero_grad with
  set_to_none=False) was accumulated in place by autograd and is not copied at all. A bucket's
  asynchronous all-reduce starts when its last gradient is ready (buckets start in order on
  every rank).
* `CoalescedDDP`: the same buckets without flat buffers: a bucket's gradients are all-reduced
  in place by one coalesced call (one NCCL group), so no pass copies them.
"""

from __future__ import annotations

import abc
import functools
import inspect
import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from lmscope.accounting.comms import plan_buckets
from lmscope.parallel.strategies import SHARDED, parse_strategy

MIB = 2**20
TORCH_DDP_BUCKET_MB = 25.0
"""PyTorch DDP's default bucket_cap_mb, what `torch-ddp` without `:<MiB>` uses."""
TORCH_DDP_FIRST_BUCKET_MB = 1.0
"""PyTorch DDP's first bucket (the first gradients backward produces) with the default cap; with
an explicit bucket_cap_mb the first bucket has that cap too."""


class DataParallel(nn.Module, abc.ABC):
    """Base of the wrappers: broadcast at construction, pass-through forward, the synced params."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "data-parallel wrappers need an initialized process group: "
                "run inside lmscope.parallel.launch or torchrun"
            )
        self.module = module
        self.world_size = dist.get_world_size()
        self.synced_parameters = [p for p in module.parameters() if p.requires_grad]
        """Parameters whose gradients are averaged, once each (module.parameters() dedups ties)."""
        self._names = {id(p): name for name, p in module.named_parameters()}
        self.reduce_op, self._divisor = _averaging(self.world_size)
        broadcast_state(module)

    @property
    def settings(self) -> dict[str, object]:
        """How this wrapper communicates: the averaging, and the bucketing where there is one."""
        return {"average": "all-reduce avg" if self._divisor is None else "divide, all-reduce sum"}

    def forward(self, *args: object, **kwargs: object) -> object:
        """The wrapped module's forward."""
        return self.module(*args, **kwargs)

    @abc.abstractmethod
    def finish_gradient_synchronization(self) -> None:
        """Wait until every gradient holds the mean over ranks."""

    def _grads(self) -> list[torch.Tensor]:
        """The gradients of the synced parameters; raises naming those that have none."""
        missing = [self._names[id(p)] for p in self.synced_parameters if p.grad is None]
        if missing:
            raise RuntimeError(_missing_message(missing))
        return [p.grad for p in self.synced_parameters]  # type: ignore[misc]

    def _divide(self, tensor: torch.Tensor) -> None:
        """Divide by the world size in place where the all-reduce does not average (gloo)."""
        if self._divisor is not None:
            tensor.div_(self._divisor)


def _averaging(world_size: int, group: dist.ProcessGroup | None = None) -> tuple[dist.ReduceOp, int | None]:
    """(reduce op, divisor or None) for `group`: AVG on NCCL; SUM after dividing by the world size
    elsewhere."""
    if dist.get_backend(group) == "nccl":
        return dist.ReduceOp.AVG, None
    return dist.ReduceOp.SUM, (world_size if world_size > 1 else None)


def broadcast_state(module: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Copy the parameters and buffers of `group`'s rank 0 (None: all ranks) to its other ranks
    (asynchronous, then waited)."""
    source = dist.get_global_rank(group or dist.group.WORLD, 0)
    with torch.no_grad():
        tensors = [*module.parameters(), *module.buffers()]
        handles = [dist.broadcast(t.detach(), src=source, group=group, async_op=True) for t in tensors]
        for handle in handles:
            handle.wait()


def _missing_message(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (
        f"no gradient reached parameter(s) {shown} in this step: every trainable parameter must be "
        "used in each step (freeze unused ones with requires_grad_(False))"
    )


class NaiveDDP(DataParallel):
    """All-reduce each parameter's gradient, one blocking call each, after backward."""

    def finish_gradient_synchronization(self) -> None:
        """Average every gradient now, one all-reduce per parameter."""
        for grad in self._grads():
            self._divide(grad)
            dist.all_reduce(grad, op=self.reduce_op)


class FlatDDP(DataParallel):
    """One all-reduce of all gradients flattened together (one per dtype and device)."""

    def finish_gradient_synchronization(self) -> None:
        """Flatten, average with one all-reduce, copy back."""
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for grad in self._grads():
            groups.setdefault((grad.dtype, grad.device), []).append(grad)
        for members in groups.values():
            flat = torch.cat([g.reshape(-1) for g in members])
            self._divide(flat)
            dist.all_reduce(flat, op=self.reduce_op)
            for grad, chunk in zip(members, flat.split([g.numel() for g in members]), strict=True):
                grad.copy_(chunk.view_as(grad))


class OverlapDDP(DataParallel):
    """Each gradient all-reduced asynchronously, in place, the moment it is accumulated."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        self._pending: list[tuple[nn.Parameter, dist.Work]] = []
        for param in self.synced_parameters:
            param.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        grad = param.grad
        assert grad is not None  # the hook runs after accumulation into .grad
        self._divide(grad)
        self._pending.append((param, dist.all_reduce(grad, op=self.reduce_op, async_op=True)))

    def finish_gradient_synchronization(self) -> None:
        """Wait for the all-reduces started during backward."""
        pending, self._pending = self._pending, []
        done = {id(p) for p, _ in pending}
        missing = [self._names[id(p)] for p in self.synced_parameters if id(p) not in done]
        for _, work in pending:
            work.wait()
        if missing:
            raise RuntimeError(_missing_message(missing))


class _Bucket:
    """The parameters of one bucket, which of them have their gradient, and its all-reduce."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.arrived = [False] * len(params)
        self.count = 0
        self.work: dist.Work | dist.distributed_c10d._CoalescingManager | None = None

    def reset(self) -> None:
        self.arrived = [False] * len(self.params)
        self.count = 0
        self.work = None


class _FlatBucket(_Bucket):
    """A bucket with one flat buffer, of which each parameter's gradient is a view (its slot)."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        super().__init__(params)
        self.buffer = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype,
                                  device=params[0].device)
        offsets = [0]
        for param in params:
            offsets.append(offsets[-1] + param.numel())
        self.views = [self.buffer[begin:end].view_as(p)
                      for p, begin, end in zip(params, offsets, offsets[1:], strict=False)]


class _BucketedBase(DataParallel):
    """Buckets in reverse parameter order, filled by gradient hooks, started in order."""

    def __init__(self, module: nn.Module, bucket_size_mb: float,
                 make_bucket: Callable[[list[nn.Parameter]], _Bucket]) -> None:
        if not (bucket_size_mb > 0 and math.isfinite(bucket_size_mb)):
            raise ValueError(f"bucket_size_mb must be a positive number, got {bucket_size_mb!r}")
        super().__init__(module)
        self.bucket_size_mb = bucket_size_mb
        order = self.synced_parameters[::-1]
        plan = plan_buckets(
            [p.numel() * p.element_size() for p in order], bucket_size_mb * MIB,
            keys=[(p.dtype, p.device) for p in order],
        )
        self.buckets = [make_bucket([order[i] for i in indices]) for indices in plan]
        self._next = 0
        for bucket in self.buckets:
            for slot, param in enumerate(bucket.params):
                param.register_post_accumulate_grad_hook(functools.partial(self._on_grad_ready, bucket, slot))

    @property
    def settings(self) -> dict[str, object]:
        return {**super().settings, "bucket_cap_mb": self.bucket_size_mb, "buckets": len(self.buckets)}

    def _on_grad_ready(self, bucket: _Bucket, slot: int, param: nn.Parameter) -> None:
        if bucket.arrived[slot]:
            raise RuntimeError(
                f"the gradient of {self._names[id(param)]} arrived twice before "
                "finish_gradient_synchronization(): run one backward per step"
            )
        self._arrived(bucket, slot, param)
        bucket.arrived[slot] = True
        bucket.count += 1
        if bucket.count == len(bucket.params):
            while self._next < len(self.buckets):
                ready = self.buckets[self._next]
                if ready.count < len(ready.params):
                    break
                ready.work = self._start(ready)
                self._next += 1

    @abc.abstractmethod
    def _arrived(self, bucket: _Bucket, slot: int, param: nn.Parameter) -> None:
        """Put the gradient of `param` (slot `slot` of `bucket`) where the bucket's all-reduce reads it."""

    @abc.abstractmethod
    def _start(self, bucket: _Bucket) -> dist.Work | dist.distributed_c10d._CoalescingManager:
        """Start the bucket's asynchronous all-reduce."""

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce; then every gradient holds the mean over ranks."""
        missing = [self._names[id(p)] for b in self.buckets
                   for p, arrived in zip(b.params, b.arrived, strict=True) if not arrived]
        for bucket in self.buckets[: self._next]:
            assert bucket.work is not None
            bucket.work.wait()
        for bucket in self.buckets:
            bucket.reset()
        self._next = 0
        if missing:
            raise RuntimeError(_missing_message(missing))


class BucketedDDP(_BucketedBase):
    """Gradients copied into flat buckets of at most `bucket_size_mb` MiB; `.grad` views the bucket."""

    def __init__(self, module: nn.Module, bucket_size_mb: float) -> None:
        super().__init__(module, bucket_size_mb, _FlatBucket)

    def _arrived(self, bucket: _Bucket, slot: int, param: nn.Parameter) -> None:
        assert isinstance(bucket, _FlatBucket)
        view = bucket.views[slot]
        grad = param.grad
        assert grad is not None  # the hook runs after accumulation into .grad
        if grad is view:  # zeroed, not set to None: autograd accumulated into the slot
            self._divide(view)
            return
        if self._divisor is None:
            view.copy_(grad)
        else:
            torch.div(grad, self._divisor, out=view)
        param.grad = view

    def _start(self, bucket: _Bucket) -> dist.Work:
        assert isinstance(bucket, _FlatBucket)
        return dist.all_reduce(bucket.buffer, op=self.reduce_op, async_op=True)


class CoalescedDDP(_BucketedBase):
    """Buckets of at most `bucket_size_mb` MiB all-reduced in place, one coalesced call each."""

    def __init__(self, module: nn.Module, bucket_size_mb: float) -> None:
        super().__init__(module, bucket_size_mb, _Bucket)

    def _arrived(self, bucket: _Bucket, slot: int, param: nn.Parameter) -> None:
        assert param.grad is not None  # the hook runs after accumulation into .grad
        self._divide(param.grad)

    def _start(self, bucket: _Bucket) -> dist.Work | dist.distributed_c10d._CoalescingManager:
        grads = [p.grad for p in bucket.params]
        if len(grads) == 1:
            return dist.all_reduce(grads[0], op=self.reduce_op, async_op=True)
        with dist.distributed_c10d._coalescing_manager(async_ops=True) as manager:
            for grad in grads:
                dist.all_reduce(grad, op=self.reduce_op)
        return manager


class TorchDDP(nn.parallel.DistributedDataParallel):
    """PyTorch's own DDP as the peer, with the settings a performance-minded user picks.

    `gradient_as_bucket_view=True` (gradients are views of the buckets: no copy back after the
    all-reduce) and no buffer broadcast before every forward (buffers are broadcast once at
    construction, as the other wrappers do: `broadcast_buffers=False`, or
    `forward_sync_buffers=False` in the PyTorch versions that deprecate the former);
    `bucket_cap_mb` as given, else PyTorch's default (25 MiB, and 1 MiB for the first bucket);
    `static_graph` and `find_unused_parameters` left off.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: float | None = None) -> None:
        device = next(module.parameters()).device
        buffers = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(
            nn.parallel.DistributedDataParallel.__init__).parameters else "broadcast_buffers")
        options = {"gradient_as_bucket_view": True, buffers: False, "static_graph": False,
                   "find_unused_parameters": False}
        super().__init__(module, device_ids=[device.index] if device.type == "cuda" else None,
                         bucket_cap_mb=bucket_cap_mb, **options)
        self.torch_settings = {
            "bucket_cap_mb": TORCH_DDP_BUCKET_MB if bucket_cap_mb is None else bucket_cap_mb,
            "first_bucket_mb": TORCH_DDP_FIRST_BUCKET_MB if bucket_cap_mb is None else bucket_cap_mb,
            **options,
        }

    @property
    def settings(self) -> dict[str, object]:
        """The DistributedDataParallel arguments used."""
        return dict(self.torch_settings)

    def finish_gradient_synchronization(self) -> None:
        """Nothing to wait for: DDP's backward returns with the gradients averaged."""


def data_parallel(strategy: str, module: nn.Module) -> nn.Module:
    """Wrap `module` with the named strategy (see `lmscope.parallel.strategies`)."""
    name, bucket_mb = parse_strategy(strategy)
    if name in SHARDED:
        raise ValueError(f"{name} shards the parameters: build it with lmscope.parallel.fsdp.FullyShardedDP "
                         "or lmscope.parallel.torch_fsdp2.torch_fully_shard")
    if name == "torch-ddp":
        return TorchDDP(module, bucket_mb)
    if bucket_mb is not None:
        return {"bucketed": BucketedDDP, "coalesced": CoalescedDDP}[name](module, bucket_mb)
    return {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP}[name](module)


def describe(wrapper: nn.Module) -> str | None:
    """The wrapper's settings as one 'key=value, ...' string (None for an unwrapped module)."""
    settings = getattr(wrapper, "settings", None)
    if not isinstance(settings, dict):
        return None
    return ", ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
                     for key, value in settings.items())
