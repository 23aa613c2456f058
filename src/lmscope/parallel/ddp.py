"""Data-parallel wrappers, from the simplest to the overlapped and bucketed kind.

Common contract: wrap any nn.Module in an initialized process group; parameters and buffers
are broadcast from rank 0 at construction (frozen ones too, so that the replicas agree);
`forward` passes through to `.module`; after backward, `finish_gradient_synchronization()`
returns once every gradient holds the mean over ranks (call it before the optimizer step).
Only parameters with requires_grad=True are communicated, each once even when tied (shared
by several modules); every one of them must receive a gradient in every step.

* `NaiveDDP`: one blocking all-reduce per parameter after backward.
* `FlatDDP`: one all-reduce of all gradients flattened into one buffer, after backward.
* `OverlapDDP`: each gradient is all-reduced asynchronously as soon as it is accumulated
  (`register_post_accumulate_grad_hook`), overlapping communication with the rest of backward.
* `BucketedDDP`: gradients grouped, in reverse parameter order (about the order backward
  produces them), into buckets of at most `bucket_size_mb` MiB (2**20 bytes, the unit of
  PyTorch's bucket_cap_mb). Each gradient is copied, already divided by the world size, into its
  bucket's flat buffer and `.grad` becomes a view of that buffer; a bucket's asynchronous
  all-reduce starts when its last gradient is ready (buckets start in order on every rank).
"""

from __future__ import annotations

import abc

import torch
import torch.distributed as dist
from torch import nn

from lmscope.accounting.comms import plan_buckets

MIB = 2**20


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
        broadcast_state(module)

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


def broadcast_state(module: nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank (asynchronous, then waited)."""
    with torch.no_grad():
        tensors = [*module.parameters(), *module.buffers()]
        handles = [dist.broadcast(t.detach(), src=0, async_op=True) for t in tensors]
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
            grad.div_(self.world_size)
            dist.all_reduce(grad)


class FlatDDP(DataParallel):
    """One all-reduce of all gradients flattened together (one per dtype and device)."""

    def finish_gradient_synchronization(self) -> None:
        """Flatten, average with one all-reduce, copy back."""
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for grad in self._grads():
            groups.setdefault((grad.dtype, grad.device), []).append(grad)
        for members in groups.values():
            flat = torch.cat([g.reshape(-1) for g in members])
            flat.div_(self.world_size)
            dist.all_reduce(flat)
            for grad, chunk in zip(members, flat.split([g.numel() for g in members]), strict=True):
                grad.copy_(chunk.view_as(grad))


class OverlapDDP(DataParallel):
    """Each gradient all-reduced asynchronously the moment it is accumulated."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(module)
        self._pending: list[tuple[nn.Parameter, dist.Work]] = []
        for param in self.synced_parameters:
            param.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        grad = param.grad
        assert grad is not None  # the hook runs after accumulation into .grad
        grad.div_(self.world_size)
        self._pending.append((param, dist.all_reduce(grad, async_op=True)))

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
    """One flat buffer, the parameters whose gradients live in it, and its all-reduce."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        self.buffer = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype,
                                  device=params[0].device)
        offsets = [0]
        for param in params:
            offsets.append(offsets[-1] + param.numel())
        self.views = {
            id(p): self.buffer[begin:end].view_as(p)
            for p, begin, end in zip(params, offsets, offsets[1:], strict=False)
        }
        self.ready = 0
        self.work: dist.Work | None = None


class BucketedDDP(DataParallel):
    """Gradients in buckets of at most `bucket_size_mb` MiB; a bucket's all-reduce starts when it fills."""

    def __init__(self, module: nn.Module, bucket_size_mb: float) -> None:
        if not bucket_size_mb > 0:
            raise ValueError(f"bucket_size_mb must be positive, got {bucket_size_mb!r}")
        super().__init__(module)
        self.bucket_size_mb = bucket_size_mb
        order = self.synced_parameters[::-1]
        plan = plan_buckets(
            [p.numel() * p.element_size() for p in order], bucket_size_mb * MIB,
            keys=[(p.dtype, p.device) for p in order],
        )
        self.buckets = [_Bucket([order[i] for i in indices]) for indices in plan]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._next = 0
        self._ready: set[int] = set()
        for param in self.synced_parameters:
            param.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        bucket = self._bucket_of[id(param)]
        view = bucket.views[id(param)]
        grad = param.grad
        assert grad is not None  # the hook runs after accumulation into .grad
        if grad.data_ptr() == view.data_ptr():  # .grad already is the view (zeroed, not set to None)
            view.div_(self.world_size)
        else:
            torch.div(grad, self.world_size, out=view)
            param.grad = view
        bucket.ready += 1
        self._ready.add(id(param))
        while self._next < len(self.buckets) and self._filled(self.buckets[self._next]):
            ready = self.buckets[self._next]
            ready.work = dist.all_reduce(ready.buffer, async_op=True)
            self._next += 1

    @staticmethod
    def _filled(bucket: _Bucket) -> bool:
        return bucket.ready == len(bucket.params)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every bucket's all-reduce; the gradients are views of the averaged buffers."""
        missing = [self._names[id(p)] for p in self.synced_parameters if id(p) not in self._ready]
        for bucket in self.buckets[: self._next]:
            assert bucket.work is not None
            bucket.work.wait()
            bucket.work = None
        for bucket in self.buckets:
            bucket.ready = 0
        self._next = 0
        self._ready.clear()
        if missing:
            raise RuntimeError(_missing_message(missing))


class TorchDDP(nn.parallel.DistributedDataParallel):
    """PyTorch's own DDP (default buckets of 25 MiB) as the peer the wrappers are measured against."""

    def finish_gradient_synchronization(self) -> None:
        """Nothing to wait for: DDP's backward returns with the gradients averaged."""


STRATEGIES = ("naive", "flat", "overlap", "bucketed:<MiB>", "torch-ddp")
"""Names `data_parallel` accepts; bucketed takes its bucket size, e.g. bucketed:25."""


def parse_strategy(strategy: str) -> tuple[str, float | None]:
    """'bucketed:25' -> ('bucketed', 25.0); 'overlap' -> ('overlap', None)."""
    name, _, size = strategy.partition(":")
    if name == "bucketed":
        try:
            bucket_mb = float(size)
        except ValueError:
            bucket_mb = -1.0
        if not bucket_mb > 0:
            raise ValueError(f"strategy {strategy!r} needs a positive bucket size in MiB, e.g. bucketed:25")
        return name, bucket_mb
    if size or name not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    return name, None


def data_parallel(strategy: str, module: nn.Module) -> nn.Module:
    """Wrap `module` with the named strategy (see STRATEGIES)."""
    name, bucket_mb = parse_strategy(strategy)
    if name == "bucketed":
        assert bucket_mb is not None
        return BucketedDDP(module, bucket_mb)
    if name == "torch-ddp":
        device = next(module.parameters()).device
        return TorchDDP(module, device_ids=[device.index] if device.type == "cuda" else None)
    return {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlapDDP}[name](module)
