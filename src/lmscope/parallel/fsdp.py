"""FullyShardedDP: our fully sharded data parallelism (ZeRO-3), one flat shard per unit and rank.

The model is cut into *units* (a Transformer block each; the embedding and the LM head; what no
unit holds, and parameters shared by several units, form the *root*). Per unit and rank:

* **Master shard.** The unit's parameters (trainable and frozen apart) are flattened in fp32 (the
  model's dtype), padded with zeros to a multiple of the world size, and each rank keeps its
  1/N slice as an `nn.Parameter` of its own: these shards are this module's `parameters()`, so
  any torch optimizer steps them. The module's own parameters are removed; while a unit runs,
  its submodules hold plain tensors that are views of the unit's gathered buffer.
* **Forward.** In a unit's forward pre-hook its full parameters are all-gathered into one flat
  buffer of the compute dtype (`param_dtype`): each rank casts its shard *before* sending, so
  the wire and the buffer are in the compute dtype. The gathers of the next two units are
  issued at once (prefetch, at most two units ahead, on a side stream on CUDA; synchronous on
  CPU). After the unit's forward its buffer's storage is freed (resized to 0 bytes; the
  tensors autograd saved keep pointing at it); the last unit stays gathered for the backward.
* **Backward.** When the gradient of a unit's output arrives (a tensor hook, before the unit's
  backward) the unit is gathered again into the same storage, and the two units before it are
  prefetched. A checkpointed unit recomputes its forward here, from the gathered parameters.
  When autograd has accumulated the gradient of the unit's flat buffer (all its parameters),
  that gradient is reduce-scattered in the compute dtype (`reduce_dtype`, default the compute
  dtype) on a side stream, averaged, and added to the fp32 shard's `.grad`; the gathered
  buffer is freed. Successive backwards (micro-batches) accumulate into the same shard grads.
  At the end of the backward (an autograd callback) the compute stream waits for the
  reduce-scatters and every buffer still gathered (the root, frozen groups) is freed.

The units must run in the order given (forward) and the reverse (backward), each once per
forward. `full_state_dict()` gathers the unsharded fp32 state on rank 0 (original names, tied
parameters under each of their names); `load_full_state_dict` takes it back from rank 0.
Outside a forward/backward the model's parameter attributes are freed views: read the state
through `full_state_dict`. With `world_size == 1` the same code runs without communication
partners (the gathers copy). See docs/fsdp.md for the order of events and how PyTorch's
FSDP2 differs.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lmscope.parallel.ddp import _averaging, broadcast_state

PREFETCH_UNITS = 2
"""How many units ahead the gathers are issued (forward: the next two; backward: the two before)."""


class _State(enum.Enum):
    FREE = "free"
    GATHERING = "gathering"
    GATHERED = "gathered"


class _FlatGroup:
    """The parameters of one unit with one requires_grad: a padded fp32 shard and a gather buffer."""

    def __init__(self, params: list[tuple[nn.Parameter, list[tuple[nn.Module, str]]]], *,
                 rank: int, world_size: int, param_dtype: torch.dtype | None) -> None:
        self.owners = [where for _, where in params]
        """Per parameter, where it is attached: [(module, attribute name), ...] (tied: several).
        The original parameters themselves are not kept: once the module drops them they are freed."""
        self.shapes = [p.shape for p, _ in params]
        self.numels = [p.numel() for p, _ in params]
        self.numel = sum(self.numels)
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padded_numel = self.shard_numel * world_size
        first = params[0][0]
        self.trainable = first.requires_grad
        self.compute_dtype = param_dtype or first.dtype
        with torch.no_grad():
            flat = torch.zeros(self.padded_numel, dtype=first.dtype, device=first.device)
            torch.cat([p.detach().reshape(-1) for p, _ in params], out=flat[: self.numel])
            begin = rank * self.shard_numel
            self.shard = nn.Parameter(flat[begin: begin + self.shard_numel].clone(),
                                      requires_grad=self.trainable)
        self.full = torch.empty(self.padded_numel, dtype=self.compute_dtype, device=first.device)
        self.full.requires_grad_(self.trainable)
        self.free()

    @property
    def padding(self) -> int:
        """Zero elements added so that the flat parameters split evenly over ranks."""
        return self.padded_numel - self.numel

    def allocate(self) -> None:
        """Give the gather buffer its storage back (on the current stream)."""
        storage = self.full.untyped_storage()
        nbytes = self.padded_numel * self.full.element_size()
        if storage.size() != nbytes:
            storage.resize_(nbytes)

    def free(self) -> None:
        """Release the gather buffer's storage; tensors viewing it stay valid objects."""
        self.full.untyped_storage().resize_(0)

    def gather(self, group: dist.ProcessGroup | None) -> None:
        """All-gather every rank's shard, cast to the compute dtype first, into the buffer."""
        send = self.shard.detach().to(self.compute_dtype)
        with torch.autograd._unsafe_preserve_version_counter(self.full):
            dist.all_gather_into_tensor(self.full.detach(), send, group=group)

    def attach(self) -> None:
        """Point each module attribute at its view of the gathered buffer (fresh views per pass)."""
        offset = 0
        for owners, shape, numel in zip(self.owners, self.shapes, self.numels, strict=True):
            view = self.full[offset: offset + numel].view(shape)
            for module, name in owners:
                setattr(module, name, view)
            offset += numel


class _Unit:
    """A module (or the root) whose parameters are gathered and freed together."""

    def __init__(self, index: int, module: nn.Module | None, groups: list[_FlatGroup]) -> None:
        self.index = index
        self.module = module
        self.groups = groups
        self.state = _State.FREE
        self.position = -1
        """Place among the gathered units in forward order (-1 for the root)."""
        self.event: torch.cuda.Event | None = None
        self.backward_started = False
        self.reduced: set[int] = set()
        """Indices of the trainable groups reduce-scattered in this backward."""


class FullyShardedDP(nn.Module):
    """Shard `module`'s parameters over the ranks by units; see the module docstring.

    `units`: the submodules gathered one at a time, in forward order (default: `default_units`).
    `param_dtype`: the compute dtype parameters are cast to before the all-gather (None: keep
    the master dtype). `reduce_dtype`: the dtype gradients are reduce-scattered in (None: the
    compute dtype). `parameters()` are the local fp32 shards: build the optimizer over them.
    """

    def __init__(self, module: nn.Module, units: Sequence[nn.Module] | None = None, *,
                 param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
                 process_group: dist.ProcessGroup | None = None) -> None:
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("FullyShardedDP needs an initialized process group: "
                               "run inside lmscope.parallel.launch or torchrun")
        self.module = module
        self.group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.param_dtype = param_dtype
        self.reduce_dtype = reduce_dtype
        self.reduce_op, self._divisor = _averaging(self.world_size)
        units = list(default_units(module) if units is None else units)
        self._state_keys = list(module.state_dict().keys())
        broadcast_state(module)
        owners = _owners(module, units)
        self._units: list[_Unit] = []
        shards = []
        for index, unit_module in [(i, m) for i, m in enumerate(units)] + [(len(units), None)]:
            groups = []
            for trainable in (True, False):
                members = [(p, where) for p, (owner, where) in owners.items()
                           if owner == index and p.requires_grad == trainable]
                if members:
                    groups.append(_FlatGroup(members, rank=self.rank, world_size=self.world_size,
                                             param_dtype=param_dtype))
            if groups:
                self._units.append(_Unit(len(self._units), unit_module, groups))
                shards += [g.shard for g in groups]
        self.root = self._units[-1] if self._units and self._units[-1].module is None else None
        self.units = [u for u in self._units if u.module is not None]
        """The gathered units in forward order (units without parameters are left out)."""
        for position, unit in enumerate(self.units):
            unit.position = position
        for _, where in owners.values():
            for owner_module, name in where:
                del owner_module._parameters[name]
        self.shards = nn.ParameterList(shards)
        device = shards[0].device if shards else torch.device("cpu")
        cuda = device.type == "cuda"
        self._gather_stream = torch.cuda.Stream(device) if cuda else None
        self._reduce_stream = torch.cuda.Stream(device) if cuda else None
        self._callback_queued = False
        self.bytes_gathered = 0
        """Bytes the all-gathers produced on this rank so far (their output buffers)."""
        self.bytes_reduced = 0
        """Bytes the reduce-scatters took in on this rank so far (the full gradients)."""
        for unit in self.units:
            assert unit.module is not None
            unit.module.register_forward_pre_hook(lambda m, a, u=unit: self._pre_forward(u))
            unit.module.register_forward_hook(lambda m, a, o, u=unit: self._post_forward(u, o))
        for unit in self._units:
            for group in unit.groups:
                if group.trainable:
                    group.full.register_post_accumulate_grad_hook(
                        lambda t, u=unit, g=group: self._reduce_scatter(u, g))

    @property
    def settings(self) -> dict[str, object]:
        """How this wrapper shards and communicates (recorded in ddp rows)."""
        def dtype(value: torch.dtype | None) -> str:
            return "master" if value is None else str(value).replace("torch.", "")

        return {
            "units": len(self.units),
            "root": self.root is not None,
            "param_dtype": dtype(self.param_dtype),
            "reduce_dtype": dtype(self.reduce_dtype or self.param_dtype),
            "prefetch": PREFETCH_UNITS,
            "padding": sum(g.padding for u in self._units for g in u.groups),
        }

    def shard_numel(self) -> int:
        """Elements of this rank's master shards (trainable and frozen, padding included)."""
        return sum(g.shard_numel for u in self._units for g in u.groups)

    def unit_numels(self) -> list[int]:
        """Unpadded parameter elements of each unit in forward order, the root last (if any)."""
        return [sum(g.numel for g in u.groups) for u in self._units]

    # ---- gather, wait, free -------------------------------------------------------------------

    def _issue(self, unit: _Unit) -> None:
        """Start gathering `unit` (no-op when it is gathered or on the way)."""
        if unit.state is not _State.FREE:
            return
        for group in unit.groups:
            group.allocate()
            self.bytes_gathered += group.padded_numel * group.full.element_size()
        if self._gather_stream is None:
            for group in unit.groups:
                group.gather(self.group)
        else:
            self._gather_stream.wait_stream(torch.cuda.current_stream(self._gather_stream.device))
            with torch.cuda.stream(self._gather_stream):
                for group in unit.groups:
                    group.gather(self.group)
                unit.event = self._gather_stream.record_event()
        unit.state = _State.GATHERING

    def _ready(self, unit: _Unit, *, attach: bool) -> None:
        """Gather `unit` if needed and make the compute stream wait for it; `attach`: fresh views
        of the buffer on the modules (each forward; the backward reuses the forward's views)."""
        self._issue(unit)
        if unit.state is _State.GATHERING:
            if unit.event is not None:
                torch.cuda.current_stream().wait_event(unit.event)
                unit.event = None
            unit.state = _State.GATHERED
        if attach:
            for group in unit.groups:
                group.attach()

    def _free(self, unit: _Unit) -> None:
        for group in unit.groups:
            group.free()
        unit.state = _State.FREE

    # ---- hooks --------------------------------------------------------------------------------

    def forward(self, *args: object, **kwargs: object) -> object:
        """The wrapped module's forward, with the root gathered first and the first units prefetched."""
        if self.root is not None:
            self._ready(self.root, attach=True)
        for unit in self.units[:PREFETCH_UNITS]:
            self._issue(unit)
        out = self.module(*args, **kwargs)
        if not torch.is_grad_enabled():
            self._finish()
        return out

    def _pre_forward(self, unit: _Unit) -> None:
        if _in_backward():  # a recompute (checkpoint through __call__): gathered, no prefetch
            self._ready(unit, attach=False)
            return
        self._ready(unit, attach=True)
        for ahead in self.units[unit.position + 1: unit.position + 1 + PREFETCH_UNITS]:
            self._issue(ahead)

    def _post_forward(self, unit: _Unit, output: Any) -> None:
        if _in_backward():
            return
        if unit is not self.units[-1] or not torch.is_grad_enabled():
            self._free(unit)
        if torch.is_grad_enabled():
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(lambda grad, u=unit: self._pre_backward(u))

    def _pre_backward(self, unit: _Unit) -> None:
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._callback_queued = True
        if unit.backward_started:
            return
        unit.backward_started = True
        self._ready(unit, attach=False)
        for before in self.units[max(unit.position - PREFETCH_UNITS, 0): unit.position][::-1]:
            self._issue(before)

    def _reduce_scatter(self, unit: _Unit, group: _FlatGroup) -> None:
        """The unit's flat gradient is complete: reduce-scatter it into the shard's fp32 grad."""
        grad = group.full.grad
        assert grad is not None
        group.full.grad = None
        grad = grad.to(self.reduce_dtype or group.compute_dtype)
        self.bytes_reduced += grad.numel() * grad.element_size()
        if group.shard.grad is None:
            group.shard.grad = torch.zeros_like(group.shard)
        if self._reduce_stream is None:
            self._reduce_into(grad, group)
        else:
            self._reduce_stream.wait_stream(torch.cuda.current_stream(self._reduce_stream.device))
            with torch.cuda.stream(self._reduce_stream):
                self._reduce_into(grad, group)
            grad.record_stream(self._reduce_stream)
        unit.reduced.add(id(group))
        if len(unit.reduced) == len(unit.groups):  # frozen groups wait for the end of the backward
            self._free(unit)

    def _reduce_into(self, grad: torch.Tensor, group: _FlatGroup) -> None:
        out = torch.empty(group.shard_numel, dtype=grad.dtype, device=grad.device)
        dist.reduce_scatter_tensor(out, grad, op=self.reduce_op, group=self.group)
        if self._divisor is not None:
            out.div_(self._divisor)
        assert group.shard.grad is not None
        group.shard.grad.add_(out)

    def _finish(self) -> None:
        """End of a backward (or a no-grad forward): wait for reduce-scatters, free every unit."""
        if self._reduce_stream is not None:
            torch.cuda.current_stream(self._reduce_stream.device).wait_stream(self._reduce_stream)
        for unit in self._units:
            if unit.state is _State.GATHERING and unit.event is not None:
                torch.cuda.current_stream().wait_event(unit.event)
                unit.event = None
            self._free(unit)
            unit.backward_started = False
            unit.reduced.clear()
        self._callback_queued = False

    # ---- state dict ---------------------------------------------------------------------------

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded state (master dtype, on CPU) on rank 0, {} elsewhere; a collective."""
        names = _attribute_names(self.module)
        values: dict[str, torch.Tensor] = {}
        for unit in self._units:
            for group in unit.groups:
                flat = torch.empty(group.padded_numel, dtype=group.shard.dtype, device=group.shard.device)
                dist.all_gather_into_tensor(flat, group.shard.detach(), group=self.group)
                if self.rank != 0:
                    continue
                offset = 0
                for owners, shape, numel in zip(group.owners, group.shapes, group.numels, strict=True):
                    tensor = flat[offset: offset + numel].view(shape).cpu().clone()
                    for module, name in owners:
                        values[f"{names[id(module)]}{name}"] = tensor
                    offset += numel
        if self.rank != 0:
            return {}
        for key, buffer in self.module.state_dict().items():
            values[key] = buffer.detach().cpu().clone()
        return {key: values[key] for key in self._state_keys if key in values}

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, torch.Tensor] | None) -> None:
        """Load an unsharded state dict given on rank 0 (others may pass None); a collective."""
        names = _attribute_names(self.module)
        if self.rank == 0:
            assert state is not None
            missing = [k for k in self._state_keys if k not in state]
            if missing:
                raise ValueError(f"state dict lacks {', '.join(missing[:5])}: pass a full_state_dict() "
                                 "of the same model")
        for unit in self._units:
            for group in unit.groups:
                flat = torch.zeros(group.padded_numel, dtype=group.shard.dtype, device=group.shard.device)
                if self.rank == 0:
                    assert state is not None
                    parts = [state[f"{names[id(owners[0][0])]}{owners[0][1]}"].reshape(-1)
                             for owners in group.owners]
                    flat[: group.numel].copy_(torch.cat(parts))
                dist.broadcast(flat, src=0, group=self.group)
                begin = self.rank * group.shard_numel
                group.shard.copy_(flat[begin: begin + group.shard_numel])
        buffers = self.module.state_dict().keys()  # the parameters are gone: buffers only
        shared = [{k: state[k] for k in buffers} if self.rank == 0 and state is not None else None]
        dist.broadcast_object_list(shared, src=0, group=self.group)
        self.module.load_state_dict(shared[0] or {}, strict=False)


def default_units(model: nn.Module) -> list[nn.Module]:
    """The units of lmscope's TransformerLM / FastTransformerLM and of transformers' Llama.

    TransformerLM: the embedding, each block, the LM head (the final norm stays in the root).
    FastTransformerLM reads the head's weight directly (fused with the loss), so the head stays
    in the root. Llama (`model.model.layers`): embed_tokens, each decoder layer, lm_head.
    """
    from lmscope.model.fast_transformer import FastTransformerLM
    from lmscope.model.transformer import TransformerLM

    if isinstance(model, FastTransformerLM):
        return [model.token_embeddings, *model.layers]
    if isinstance(model, TransformerLM):
        return [model.token_embeddings, *model.layers, model.lm_head]
    inner = getattr(model, "model", None)
    if inner is not None and isinstance(getattr(inner, "layers", None), nn.ModuleList):
        head = getattr(model, "lm_head", None)
        return [inner.embed_tokens, *inner.layers, *([head] if head is not None else [])]
    raise ValueError(f"no default units for {type(model).__name__}: pass units=[...] "
                     "(the submodules to gather one at a time, e.g. model.blocks)")


Owners = dict[nn.Parameter, tuple[int, list[tuple[nn.Module, str]]]]


def _owners(model: nn.Module, units: list[nn.Module]) -> Owners:
    """Parameter -> (index of the unit that owns it; len(units) for the root, where), in model order.

    A parameter attached only inside one unit belongs to that unit; one attached outside every
    unit, or inside several (tied), belongs to the root, which stays gathered for the whole step.
    """
    if any(unit is model for unit in units):
        raise ValueError("the whole model cannot be a unit: pass its blocks")
    in_units: dict[int, set[int]] = {}  # id(submodule) -> the units it is part of (shared ones: several)
    for index, unit in enumerate(units):
        for sub in unit.modules():
            if sub is not unit and any(sub is other for other in units):
                raise ValueError("one unit holds another: pass disjoint submodules as units")
            in_units.setdefault(id(sub), set()).add(index)
    found: dict[nn.Parameter, tuple[set[int], list[tuple[nn.Module, str]]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is None:
                continue
            indices, where = found.setdefault(param, (set(), []))
            indices.update(in_units.get(id(module), {len(units)}))
            where.append((module, name))
    return {p: (next(iter(i)) if len(i) == 1 else len(units), w) for p, (i, w) in found.items()}


def _attribute_names(model: nn.Module) -> dict[int, str]:
    """id(submodule) -> its state-dict prefix ('' for the model, 'layers.0.' ...)."""
    return {id(m): (f"{name}." if name else "") for name, m in model.named_modules(remove_duplicate=False)}


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []


def _in_backward() -> bool:
    """Whether autograd is running a backward now (a checkpoint's recompute runs inside one)."""
    return torch._C._current_graph_task_id() != -1
