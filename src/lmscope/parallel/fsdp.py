"""FullyShardedDP: our fully sharded data parallelism (ZeRO-3), one flat shard per unit and rank.

The model is cut into *units* (a Transformer block each; the embedding and the LM head; what no
unit holds, and parameters shared by several units, form the *root*). Per unit and rank:

* **Master shard.** The unit's parameters (trainable and frozen apart, and those of modules kept
  in fp32 apart) are flattened in fp32 (the model's dtype), padded with zeros to a multiple of
  the world size, and each rank keeps its 1/N slice as an `nn.Parameter` of its own: these
  shards are this module's `parameters()`, so any torch optimizer steps them. The module's own
  parameters are removed; while a unit runs, its submodules hold plain tensors (in their
  `__dict__`, ahead of the placeholders) that are views of the unit's gathered buffer.
* **Forward.** In a unit's forward pre-hook its full parameters are all-gathered into one flat
  buffer of the compute dtype (`param_dtype`; the master dtype for modules in `keep_fp32`): each
  rank casts its shard into its own slot of that buffer and gathers in place, so the wire and
  the buffer are in the compute dtype and nothing else is allocated. The gathers of the next
  `prefetch` units (default two) are issued at once, on a side stream on CUDA (synchronous on
  CPU). The modules see the buffer through one `split` into per-parameter views, so the
  backward assembles the buffer's gradient with one concatenation. After the unit's forward its
  buffer's storage is freed (resized to 0 bytes; the tensors autograd saved keep pointing at
  it) and its views leave the modules; the last unit stays gathered for the backward.
* **Backward.** When the gradient of a unit's output arrives (a tensor hook, before the unit's
  backward) the unit is gathered again into the same storage, and the `prefetch` units before
  it are issued. A checkpointed unit recomputes its forward here, from the gathered parameters.
  When autograd has accumulated the gradient of the unit's flat buffer (all its parameters),
  that gradient is reduce-scattered in place in the compute dtype (`reduce_dtype`, default the
  compute dtype) on a second side stream, averaged, and written (first micro-batch) or added
  to the fp32 shard's `.grad` (or, with `hand_gradients_to(consumer)`, handed to an optimizer
  that updates the shard right there: `lmscope.parallel.host_adamw`); the gathered buffer is
  freed. Successive backwards (micro-batches) accumulate into the same shard grads. At the end
  of the backward (an autograd callback) the compute stream waits for the reduce-scatters and
  every buffer still gathered (the root, frozen groups) is freed.

The units run in one order every forward (the reverse in the backward), each once per forward:
a list of modules must be given in that order (the first forward checks it), a class policy and
the default units take the order of the first forward (`lmscope.parallel.fsdp_units`).

Outside a forward/backward the model holds a `ShardedParameter` under each original name (full
shape, no data; `to_local()` and `.grad.to_local()` are this rank's pieces of the shard and its
gradient; reading its values raises and says how to read them): `named_parameters()` gives the
original names, `parameters()` the flat shards the optimizer steps. `summon_full_params()`
gathers every parameter in full for reading (or writing back); `full_state_dict()` gathers the
unsharded fp32 state (original names, tied parameters under each of their names) on the group's
rank 0 or on every rank; `load_full_state_dict` takes it back. With `world_size == 1` the same
code runs without communication partners (the gathers copy). See docs/fsdp.md for the order of
events, the options and how PyTorch's FSDP2 differs.
"""

from __future__ import annotations

import contextlib
import enum
import math
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from lmscope.measure.ranges import traced
from lmscope.model.tensor_leaves import tensors_in
from lmscope.parallel.ddp import _averaging, broadcast_state
from lmscope.parallel.fsdp_precision import KeepFp32, cast_at_boundaries, kept_modules
from lmscope.parallel.fsdp_units import UnitsSpec, default_units, parameter_owners, resolve_units
from lmscope.parallel.sharded_param import READ_HINT, ShardedParameter

__all__ = ["PREFETCH_UNITS", "FullyShardedDP", "GradientConsumer", "default_units"]

PREFETCH_UNITS = 2
"""How many units ahead the gathers are issued by default (forward: the next two; backward: the
two before): `FullyShardedDP(prefetch=...)`."""

Owner = list[tuple[nn.Module, str]]
"""Where one parameter is attached: [(module, attribute name), ...] (tied: several)."""


class GradientConsumer(Protocol):
    """Takes shards' reduced gradients in the backward instead of their ``.grad``: an optimizer that
    updates each unit as soon as its gradient is reduced (`lmscope.parallel.host_adamw`)."""

    def takes(self, shard: nn.Parameter) -> bool:
        """Whether `update` takes this shard's gradient (else it goes to ``.grad`` as usual)."""
        ...

    def prefetch(self, shard: nn.Parameter) -> None:
        """The shard's unit starts its backward: its gradient follows (a hint, on the host)."""
        ...

    def forward_starts(self) -> None:
        """A forward that records for a backward starts: the place to refuse one (nothing has
        changed yet), rather than in the middle of the backward."""
        ...

    def update(self, shard: nn.Parameter, grad: torch.Tensor) -> None:
        """The shard's gradient, averaged over ranks, in the reduce dtype: a view read on the
        current stream (the reduce stream on CUDA) that is reused once that stream moves on."""
        ...


class _State(enum.Enum):
    FREE = "free"
    GATHERING = "gathering"
    GATHERED = "gathered"


class _FlatGroup:
    """The parameters of one unit with one requires_grad and compute dtype: a padded fp32 shard
    and a gather buffer in the compute dtype."""

    def __init__(self, params: list[tuple[nn.Parameter, Owner]], *, rank: int, world_size: int,
                 compute_dtype: torch.dtype, reduce_dtype: torch.dtype) -> None:
        self.owners = [where for _, where in params]
        """Per parameter, where it is attached. The original parameters themselves are not kept:
        once the module drops them they are freed."""
        self.shapes = [p.shape for p, _ in params]
        self.numels = [p.numel() for p, _ in params]
        self.numel = sum(self.numels)
        self.shard_numel = math.ceil(self.numel / world_size)
        self.padded_numel = self.shard_numel * world_size
        padding = self.padded_numel - self.numel
        self.sizes = [*self.numels, padding] if padding else list(self.numels)
        """How `views` splits the flat buffer: each parameter, then the padding (if any)."""
        self.begin = rank * self.shard_numel
        """Where this rank's shard begins in the flat parameters."""
        first = params[0][0]
        self.trainable = first.requires_grad
        self.compute_dtype = compute_dtype
        self.reduce_dtype = reduce_dtype
        with torch.no_grad():
            flat = torch.zeros(self.padded_numel, dtype=first.dtype, device=first.device)
            torch.cat([p.detach().reshape(-1) for p, _ in params], out=flat[: self.numel])
            self.shard = nn.Parameter(flat[self.begin: self.begin + self.shard_numel].clone(),
                                      requires_grad=self.trainable)
        self.full = torch.empty(self.padded_numel, dtype=compute_dtype, device=first.device)
        self.full.requires_grad_(self.trainable)
        self.nbytes = self.padded_numel * self.full.element_size()
        """Bytes of the gathered buffer."""
        self.reduce_nbytes = self.padded_numel * reduce_dtype.itemsize
        """Bytes of the gradient the reduce-scatter takes in."""
        self._storage = self.full.untyped_storage()
        self._flat = torch.empty(0, dtype=compute_dtype, device=first.device).set_(
            self._storage, 0, (self.padded_numel,))
        """The buffer under a version counter of its own: the gathers write through it, and the
        version autograd checks on the views it saved (shared with `full`) stays put."""
        self._mine = self._flat[self.begin: self.begin + self.shard_numel]
        """This rank's slot of the buffer: the gather's input."""
        self._slots: list[tuple[dict[str, Any], str, torch.Tensor]] = []
        """(module's __dict__, attribute, view) per place, as the last forward attached them."""
        self.attached = False
        """Whether the modules hold views of `full` now (between a unit's gather and its free)."""
        self.free()

    @property
    def padding(self) -> int:
        """Zero elements added so that the flat parameters split evenly over ranks."""
        return self.padded_numel - self.numel

    def allocate(self) -> None:
        """Give the gather buffer its storage back (on the current stream)."""
        if self._storage.size() != self.nbytes:
            self._storage.resize_(self.nbytes)

    def free(self) -> None:
        """Release the gather buffer's storage and take its views off the modules (tensors autograd
        saved stay valid objects; the modules show their placeholders again)."""
        self._storage.resize_(0)
        self.detach_views()

    def detach_views(self) -> None:
        """Take the views of the gathered buffer off the modules (their placeholders show again)."""
        if self.attached:
            for attributes, name, _ in self._slots:
                attributes.pop(name, None)
            self.attached = False

    def gather(self, group: dist.ProcessGroup | None) -> None:
        """All-gather every rank's shard into the buffer, in place: this rank's shard is cast to the
        compute dtype into its own slot, which is the collective's input (no send buffer)."""
        self._mine.copy_(self.shard.detach())
        dist.all_gather_into_tensor(self._flat, self._mine, group=group)

    def gather_master(self, group: dist.ProcessGroup | None) -> torch.Tensor:
        """Every rank's shard in the master dtype, in a new flat tensor (padding included)."""
        flat = torch.empty(self.padded_numel, dtype=self.shard.dtype, device=self.shard.device)
        dist.all_gather_into_tensor(flat, self.shard.detach(), group=group)
        return flat

    def views(self, flat: torch.Tensor) -> Iterator[tuple[Owner, torch.Tensor]]:
        """(where, the parameter's view of `flat`) per parameter: one `split` of the whole buffer,
        so that autograd gives `flat` its gradient with one concatenation of the parameters'
        gradients (slices would each add a zero-filled copy of the whole buffer)."""
        pieces = flat.split(self.sizes)[: len(self.owners)]  # the padding's piece is left out
        for owners, shape, piece in zip(self.owners, self.shapes, pieces, strict=True):
            yield owners, piece.view(shape)

    def attach(self, *, fresh: bool) -> None:
        """Put views of the gathered buffer on the modules, ahead of their placeholders in
        `module._parameters`: new ones (each forward), or the last forward's again (a checkpoint's
        recompute in the backward, whose saved tensors must come from the same graph).

        New views each forward place their `split` node in the autograd graph where the unit
        runs: autograd runs the newest ready node first, so the unit's flat gradient (and its
        reduce-scatter) is complete as soon as the unit's backward is. Views made once would carry
        the sequence number of their creation, older than every forward op, and autograd would
        leave every unit's gradient, its reduce-scatter and its gathered buffer to the end of the
        backward."""
        if fresh or not self._slots:
            self._slots = [(vars(module), name, view) for owners, view in self.views(self.full)
                           for module, name in owners]
        for attributes, name, view in self._slots:
            attributes[name] = view
        self.attached = True

    def place_placeholders(self, names: dict[int, str]) -> None:
        """Register a ShardedParameter under every name of every parameter of this group."""
        offset = 0
        end = self.begin + self.shard_numel
        for owners, shape, numel in zip(self.owners, self.shapes, self.numels, strict=True):
            start = min(max(self.begin - offset, 0), numel)
            stop = max(min(end - offset, numel), start)
            local = min(max(offset + start - self.begin, 0), self.shard_numel)
            module, name = owners[0]
            placeholder = ShardedParameter(f"{names[id(module)]}{name}", shape, self, local, (start, stop),
                                           requires_grad=self.trainable)
            for module, name in owners:
                module._parameters[name] = placeholder
            offset += numel


class _Unit:
    """A module (or the root) whose parameters are gathered and freed together."""

    def __init__(self, index: int, module: nn.Module | None, groups: list[_FlatGroup], name: str) -> None:
        self.index = index
        self.module = module
        self.groups = groups
        self.name = name
        """Its name in the model ('layers.0'), or 'the root'."""
        self.nbytes = sum(group.nbytes for group in groups)
        """Bytes of its gathered buffers."""
        self.state = _State.FREE
        self.position = -1
        """Place among the gathered units in forward order (-1 for the root)."""
        self.ahead: list[_Unit] = []
        """The units whose gathers its forward issues (the next `prefetch` ones)."""
        self.behind: list[_Unit] = []
        """The units whose gathers its backward issues (the `prefetch` before it, nearest first)."""
        self.grad_hook: Callable[[torch.Tensor], None] | None = None
        """The hook its outputs' gradients call (the wrapper's pre-backward of this unit)."""
        self.event: torch.cuda.Event | None = None
        self.backward_started = False
        self.reduced: set[int] = set()
        """Indices of the trainable groups reduce-scattered in this backward."""


class _Traffic:
    """Bytes moved on this rank so far: a plain object, since every attribute set on a Module
    goes through `Module.__setattr__` (the hooks count on each call)."""

    def __init__(self) -> None:
        self.gathered = 0
        self.reduced = 0


class FullyShardedDP(nn.Module):
    """Shard `module`'s parameters over the ranks by units; see the module docstring.

    `units`: the submodules gathered one at a time, in forward order; or a tuple of module
    classes (every outermost module of them, in the order of the first forward); None:
    `default_units` (lmscope's models, any transformers model). `param_dtype`: the compute dtype
    parameters are cast to before the all-gather (None: keep the master dtype). `reduce_dtype`:
    the dtype gradients are reduce-scattered in (None: the compute dtype). `keep_fp32`: module
    classes or modules whose parameters stay in the master dtype (`fsdp_precision`).
    `process_group`: the ranks that shard this model (None: all). `reduce_group`: a second group
    of the same ranks, in the same order, for the reduce-scatters (None: `process_group`): NCCL
    runs the collectives of one group one after another on one stream, so in the backward a
    gather queues behind the reduce-scatter issued before it; with a group of their own the two
    can run at once (make it with `dist.new_group(ranks)` on every rank; it costs NCCL one more
    communicator). `prefetch`: how many units'
    gathers are issued ahead of the unit that runs (more hides slower links, each costs one
    unit's gathered buffer of memory). `parameters()` are the local fp32 shards: build the
    optimizer over them; `named_parameters()` gives the original names.
    """

    def __init__(self, module: nn.Module, units: UnitsSpec = None, *,
                 param_dtype: torch.dtype | None = None, reduce_dtype: torch.dtype | None = None,
                 keep_fp32: KeepFp32 = (), process_group: dist.ProcessGroup | None = None,
                 reduce_group: dist.ProcessGroup | None = None, prefetch: int = PREFETCH_UNITS) -> None:
        super().__init__()
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("FullyShardedDP needs an initialized process group: "
                               "run inside lmscope.parallel.launch or torchrun")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch={prefetch!r}: give the number of units gathered ahead, a whole "
                             f"number >= 0 (0: each unit is gathered when it runs; default {PREFETCH_UNITS})")
        if reduce_group is not None and _ranks(reduce_group) != _ranks(process_group):
            raise ValueError(f"reduce_group has ranks {_ranks(reduce_group)}, the model is sharded over "
                             f"{_ranks(process_group)}: give a group of the same ranks in the same order "
                             "(dist.new_group(ranks) on every rank), or None to reduce on process_group")
        self.prefetch = prefetch
        """Units whose gathers are issued ahead of the one running (forward: after it; backward:
        before it)."""
        self.module = module
        self.group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self._source_rank = dist.get_global_rank(process_group or dist.group.WORLD, 0)
        """The global rank of this group's rank 0 (broadcasts start there)."""
        self.param_dtype = param_dtype
        self.reduce_dtype = reduce_dtype
        self.reduce_group = reduce_group if reduce_group is not None else process_group
        """The group the reduce-scatters run on (`process_group` unless one of their own was given)."""
        self.reduce_op, self._divisor = _averaging(self.world_size, self.reduce_group)
        chosen, self._learn_order = resolve_units(module, units)
        kept = kept_modules(module, keep_fp32) if keep_fp32 else []
        self._state_keys = list(module.state_dict().keys())
        broadcast_state(module, process_group)
        names = _attribute_names(module)
        self._units = self._build_units(chosen, names, kept)
        self._param_keys = {f"{names[id(owner)]}{attribute}" for group in self._groups()
                            for where in group.owners for owner, attribute in where}
        """The state-dict keys of parameters (tied ones under each name); the other keys are buffers."""
        self.root = self._units[-1] if self._units and self._units[-1].module is None else None
        self.units = [u for u in self._units if u.module is not None]
        """The gathered units in forward order (units without parameters are left out)."""
        self._place_units()
        self._order_known = False
        self._in_forward = False
        self._ran: list[_Unit] = []
        """The units that ran in this forward so far, in order."""
        for group in self._groups():
            group.place_placeholders(names)
        self.shards = nn.ParameterList([g.shard for g in self._groups()])
        if param_dtype is not None:
            for module_kept in kept:
                master = next((p.dtype for p in module_kept.parameters()), self.shards[0].dtype)
                cast_at_boundaries(module_kept, inputs=master, outputs=param_dtype)
        self._kept = len(kept)
        device = self.shards[0].device if len(self.shards) else torch.device("cpu")
        cuda = device.type == "cuda"
        # high priority: a gather's cast and a reduce-scatter's copy into the fp32 grad start as soon
        # as they may, ahead of the compute kernels waiting to run, so neither delays a collective
        self._gather_stream = torch.cuda.Stream(device, priority=-1) if cuda else None
        self._reduce_stream = torch.cuda.Stream(device, priority=-1) if cuda else None
        self._callback_queued = False
        self._traffic = _Traffic()
        self._consumer_ref: Callable[[], GradientConsumer | None] = lambda: None
        """The consumer `hand_gradients_to` gave, held weakly: dropping it hands back to `.grad`."""
        self._register_hooks()

    def _build_units(self, chosen: list[nn.Module], names: dict[int, str],
                     kept: list[nn.Module]) -> list[_Unit]:
        """The units with their flat groups (one per requires_grad and kept-in-fp32), the root last."""
        found = parameter_owners(self.module, chosen)
        in_kept = {id(sub) for k in kept for sub in k.modules()}
        units: list[_Unit] = []
        for index, unit_module in [*enumerate(chosen), (len(chosen), None)]:
            members: dict[tuple[bool, bool], list[tuple[nn.Parameter, Owner]]] = {}
            for param, (owner, where) in found.items():
                if owner == index:
                    kept_here = any(id(m) in in_kept for m, _ in where)
                    members.setdefault((param.requires_grad, kept_here), []).append((param, where))
            groups = [self._flat_group(params, kept=kept_here) for (_, kept_here), params
                      in sorted(members.items(), key=lambda item: (not item[0][0], item[0][1]))]
            if groups:
                name = names[id(unit_module)][:-1] if unit_module is not None else "the root"
                units.append(_Unit(len(units), unit_module, groups, name))
        return units

    def _place_units(self) -> None:
        """Number the units in forward order and give each the units its hooks prefetch."""
        for position, unit in enumerate(self.units):
            unit.position = position
            unit.ahead = self.units[position + 1: position + 1 + self.prefetch]
            unit.behind = self.units[max(position - self.prefetch, 0): position][::-1]

    def _register_hooks(self) -> None:
        """Forward pre/post hooks on every unit; a post-accumulate hook on every trainable buffer."""
        for unit in self.units:
            assert unit.module is not None
            unit.module.register_forward_pre_hook(lambda m, a, u=unit: self._pre_forward(u))
            unit.module.register_forward_hook(lambda m, a, o, u=unit: self._post_forward(u, o))
            unit.grad_hook = lambda grad, u=unit: self._pre_backward(u)
        for unit in self._units:
            for group in unit.groups:
                if group.trainable:
                    group.full.register_post_accumulate_grad_hook(
                        lambda t, u=unit, g=group: self._reduce_scatter(u, g))

    def _flat_group(self, params: list[tuple[nn.Parameter, Owner]], *, kept: bool) -> _FlatGroup:
        """A group computing in `param_dtype`, or (kept in fp32, or no param_dtype) in the master dtype;
        reducing in `reduce_dtype` (else its compute dtype), kept ones in the master dtype."""
        master = params[0][0].dtype
        compute = master if kept or self.param_dtype is None else self.param_dtype
        reduce = master if kept else (self.reduce_dtype or compute)
        return _FlatGroup(params, rank=self.rank, world_size=self.world_size, compute_dtype=compute,
                          reduce_dtype=reduce)

    @property
    def bytes_gathered(self) -> int:
        """Bytes the all-gathers produced on this rank so far (their output buffers)."""
        return self._traffic.gathered

    @property
    def bytes_reduced(self) -> int:
        """Bytes the reduce-scatters took in on this rank so far (the full gradients)."""
        return self._traffic.reduced

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
            **({"kept_fp32": self._kept} if self._kept else {}),
            "prefetch": self.prefetch,
            "reduce_group": "shared" if self.reduce_group is self.group else "separate",
            "padding": sum(g.padding for g in self._groups()),
        }

    def hand_gradients_to(self, consumer: GradientConsumer | None) -> None:
        """From the next backward on, hand the shards `consumer` takes their reduced gradient (on the
        reduce stream, as soon as it is reduced) instead of writing it into ``.grad``; None: back to
        ``.grad``. Such shards never hold a gradient, so there is nothing to accumulate over
        micro-batches or to clip. Held weakly (the model keeps no optimizer alive): once the
        consumer is gone the gradients go to ``.grad`` again."""
        self._consumer_ref = (lambda: None) if consumer is None else weakref.ref(consumer)

    @property
    def _consumer(self) -> GradientConsumer | None:
        return self._consumer_ref()

    def shards_reduced_last(self) -> list[nn.Parameter]:
        """The trainable shards whose gradients are reduced at the end of the backward: the root's
        and the first unit's (in forward order, so the last to run its backward)."""
        last = ([self.root] if self.root is not None else []) + self.units[:1]
        return [group.shard for unit in last for group in unit.groups if group.trainable]

    def _groups(self) -> Iterator[_FlatGroup]:
        """Every flat group, unit by unit (forward order of construction), the root last."""
        return (group for unit in self._units for group in unit.groups)

    def shard_numel(self) -> int:
        """Elements of this rank's master shards (trainable and frozen, padding included)."""
        return sum(g.shard_numel for g in self._groups())

    def unit_numels(self) -> list[int]:
        """Unpadded parameter elements of each unit in forward order, the root last (if any)."""
        return [sum(g.numel for g in u.groups) for u in self._units]

    # ---- parameters under their names -------------------------------------------------------

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """This rank's flat shards, one per unit and group, each once: what the optimizer steps."""
        return iter(self.shards)

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's parameters under their original names (no 'module.' prefix): between steps
        ShardedParameters (`to_local()`, `.grad.to_local()`: this rank's pieces), inside
        `summon_full_params()` the full tensors. For the optimizer use `parameters()`."""
        return self.module.named_parameters(prefix=prefix, recurse=recurse, remove_duplicate=remove_duplicate)

    @contextlib.contextmanager
    def summon_full_params(self, *, writeback: bool = False) -> Iterator[None]:
        """Inside, every parameter of the model is its full tensor (master dtype, no grad) under its
        name, on every rank; with `writeback`, what was written to them goes back into the shards
        at the exit. A collective on entry; it holds the whole model on each rank meanwhile. Not
        inside a forward/backward."""
        if _in_backward():
            raise RuntimeError("summon_full_params() runs between steps, not inside a backward")
        gathered = []
        with torch.no_grad():
            for group in self._groups():
                group.detach_views()  # a unit gathered for a pending backward stays gathered
                flat = group.gather_master(self.group)
                for owners, view in group.views(flat):
                    full = nn.Parameter(view, requires_grad=False)
                    for module, name in owners:
                        module._parameters[name] = full
                gathered.append((group, flat))
        try:
            yield
        finally:
            names = _attribute_names(self.module)
            with torch.no_grad():
                for group, flat in gathered:
                    if writeback:
                        group.shard.copy_(flat[group.begin: group.begin + group.shard_numel])
                    group.place_placeholders(names)

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the sharded gradients so that their L2 norm over every rank is at most `max_norm`;
        returns the norm before (a collective). torch.nn.utils.clip_grad_norm_ over `parameters()`
        would see this rank's shards only, and ranks would scale by different factors."""
        if self._consumer is not None:
            raise RuntimeError(f"the shards' gradients go to {type(self._consumer).__name__} inside the "
                               "backward (hand_gradients_to), never to .grad: there is nothing to clip; "
                               "use an optimizer that steps after the backward to clip")
        grads = [p.grad for p in self.shards if p.grad is not None]
        device = self.shards[0].device
        squares = torch.zeros((), dtype=torch.float32, device=device)
        for grad in grads:
            squares += grad.float().pow(2).sum()
        dist.all_reduce(squares, group=self.group)
        total = squares.sqrt()
        scale = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for grad in grads:
            grad.mul_(scale.to(grad.dtype))
        return total

    def finish_gradient_synchronization(self) -> None:
        """Wait until every shard gradient holds the mean over ranks (the end of the backward has
        already waited: kept so that code written for the DDP wrappers runs unchanged)."""
        if self._reduce_stream is not None:
            torch.cuda.current_stream(self._reduce_stream.device).wait_stream(self._reduce_stream)

    # ---- gather, wait, free -------------------------------------------------------------------

    @traced("fsdp/all_gather")
    def _issue(self, units: list[_Unit]) -> None:
        """Start gathering those of `units` that are free (the others are gathered or on the way):
        on CUDA on the gather stream, after what the compute stream (where the buffers are
        allocated) has queued."""
        free = [unit for unit in units if unit.state is _State.FREE]
        if not free:
            return
        for unit in free:
            for group in unit.groups:
                group.allocate()
            self._traffic.gathered += unit.nbytes
        if self._gather_stream is None:
            self._gather(free)
        else:
            _on_side_stream(self._gather_stream, lambda: self._gather(free, self._gather_stream))
        for unit in free:
            unit.state = _State.GATHERING

    def _gather(self, units: list[_Unit], stream: torch.cuda.Stream | None = None) -> None:
        """Gather every group of `units`; on `stream` (the current one) each unit's gathers are
        followed by an event that its `_ready` waits for."""
        for unit in units:
            for group in unit.groups:
                group.gather(self.group)
            if stream is not None:
                unit.event = stream.record_event()

    def _ready(self, unit: _Unit, *, fresh: bool = False) -> None:
        """Gather `unit` if needed, make the compute stream wait for it and put views on the
        modules: `fresh` ones (a forward), else the last forward's where they are not on."""
        if unit.state is not _State.GATHERED:
            if unit.state is _State.FREE:
                self._issue([unit])
            if unit.event is not None:
                torch.cuda.current_stream().wait_event(unit.event)
                unit.event = None
            unit.state = _State.GATHERED
        for group in unit.groups:
            if fresh or not group.attached:
                group.attach(fresh=fresh)

    def _free(self, unit: _Unit) -> None:
        for group in unit.groups:
            group.free()
        unit.state = _State.FREE

    # ---- hooks --------------------------------------------------------------------------------

    def forward(self, *args: object, **kwargs: object) -> object:
        """The wrapped module's forward, with the root gathered first and the first units prefetched."""
        self._start_forward()
        self._in_forward = True
        try:
            out = self.module(*args, **kwargs)
        finally:
            self._in_forward = False
        if not self._order_known:
            self._settle_order()
        if not torch.is_grad_enabled():
            self._finish()
        return out

    @traced("fsdp/forward_start")
    def _start_forward(self) -> None:
        """Gather the root (the compute stream waits for it) and issue the first units' gathers."""
        consumer = self._consumer
        if consumer is not None and torch.is_grad_enabled():
            consumer.forward_starts()
        self._ran = []
        if self.root is not None:
            self._ready(self.root, fresh=True)
        self._issue(self.units[: max(self.prefetch, 1)])

    @traced("fsdp/pre_forward")
    def _pre_forward(self, unit: _Unit) -> None:
        if _in_backward():  # a recompute (checkpoint through __call__): gathered, no prefetch
            self._ready(unit)
            return
        if not self._in_forward:
            raise RuntimeError(f"FullyShardedDP unit {unit.name} ran outside the wrapper's forward: "
                               f"{READ_HINT}")
        self._check_order(unit)
        self._ran.append(unit)
        self._ready(unit, fresh=True)
        self._issue(unit.ahead)

    def _check_order(self, unit: _Unit) -> None:
        """Raise where `unit` runs twice, or out of the order given (a list) or learned (the first
        forward, which records the order of a class policy or the default units)."""
        last = self._ran[-1] if self._ran else None
        learning = self._learn_order and not self._order_known
        if last is None or (unit.position > last.position and not learning):
            return
        if unit in self._ran:
            raise RuntimeError(f"FullyShardedDP unit {unit.name} ran twice in one forward: each unit runs "
                               "once per forward (leave a module called twice out of the units)")
        if learning:
            return
        if self._order_known:
            raise RuntimeError(f"FullyShardedDP unit {unit.name} ran after {last.name}, out of the order of "
                               "the first forward: the units must run in the same order every forward")
        raise RuntimeError(f"FullyShardedDP units are not in forward order: {unit.name} ran after "
                           f"{last.name}; pass them in forward order, or as classes "
                           "(units=(nn.Linear, ...)), whose order is taken from the first forward")

    def _settle_order(self) -> None:
        """After the first forward: a learned order becomes the units' order (for the prefetches)."""
        if self._learn_order:
            self.units = self._ran + [u for u in self.units if u not in self._ran]
            self._place_units()
        self._order_known = True

    @traced("fsdp/post_forward")
    def _post_forward(self, unit: _Unit, output: Any) -> None:
        if _in_backward():
            return
        grad_enabled = torch.is_grad_enabled()
        if unit is not self.units[-1] or not grad_enabled:
            self._free(unit)
        if grad_enabled:
            for tensor in (output,) if isinstance(output, torch.Tensor) else tensors_in(output):
                if tensor.requires_grad:
                    tensor.register_hook(unit.grad_hook)

    @traced("fsdp/pre_backward")
    def _pre_backward(self, unit: _Unit) -> None:
        if not self._callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self._callback_queued = True
        if unit.backward_started:
            return
        unit.backward_started = True
        if self._consumer is not None:
            for group in unit.groups:
                if group.trainable:
                    self._consumer.prefetch(group.shard)
        self._ready(unit)
        self._issue(unit.behind)

    @traced("fsdp/post_backward")
    def _reduce_scatter(self, unit: _Unit, group: _FlatGroup) -> None:
        """The unit's flat gradient is complete: reduce-scatter it into the shard's fp32 grad."""
        full = group.full
        grad = full.grad
        assert grad is not None
        full.grad = None
        if grad.dtype != group.reduce_dtype:
            grad = grad.to(group.reduce_dtype)
        self._traffic.reduced += group.reduce_nbytes
        shard = group.shard
        consumer = self._consumer if self._consumer is not None and self._consumer.takes(shard) else None
        accumulate = shard.grad is not None
        if not accumulate and consumer is None:
            shard.grad = torch.empty_like(shard)  # on the compute stream, which frees it after the optimizer
        stream = self._reduce_stream
        if stream is None:
            self._reduce_into(grad, group, accumulate=accumulate, consumer=consumer)
        else:
            _on_side_stream(stream, lambda: self._reduce_into(grad, group, accumulate=accumulate,
                                                              consumer=consumer))
            grad.record_stream(stream)
        unit.reduced.add(id(group))
        if len(unit.reduced) == len(unit.groups):  # frozen groups wait for the end of the backward
            self._free(unit)

    def _reduce_into(self, grad: torch.Tensor, group: _FlatGroup, *, accumulate: bool,
                     consumer: GradientConsumer | None) -> None:
        """Reduce-scatter `grad` in place (this rank's slot of it is the output), average, and hand
        it to `consumer`, or write it into the shard's grad (cast to the master dtype) or add it there."""
        out = grad[group.begin: group.begin + group.shard_numel]
        dist.reduce_scatter_tensor(out, grad, op=self.reduce_op, group=self.reduce_group)
        if self._divisor is not None:
            out.div_(self._divisor)
        if consumer is not None:
            consumer.update(group.shard, out)
            return
        assert group.shard.grad is not None
        if accumulate:
            group.shard.grad.add_(out)
        else:
            group.shard.grad.copy_(out)

    @traced("fsdp/finish")
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
    def full_state_dict(self, *, rank0_only: bool = True,
                        device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """The unsharded state (master dtype, original names, on `device`), a collective: on the
        group's rank 0 only ({} elsewhere), or with `rank0_only=False` on every rank."""
        keep = not rank0_only or self.rank == 0
        names = _attribute_names(self.module)
        values: dict[str, torch.Tensor] = {}
        for group in self._groups():
            flat = group.gather_master(self.group)
            if not keep:
                continue
            for owners, view in group.views(flat):
                tensor = view.to(device, copy=True)
                for module, name in owners:
                    values[f"{names[id(module)]}{name}"] = tensor
        if not keep:
            return {}
        for key, buffer in self.module.state_dict().items():
            if key not in self._param_keys:
                values[key] = buffer.detach().to(device, copy=True)
        return {key: values[key] for key in self._state_keys if key in values}

    @torch.no_grad()
    def load_full_state_dict(self, state: dict[str, torch.Tensor] | None, *, rank0_only: bool = True) -> None:
        """Load an unsharded state dict (a collective): given on the group's rank 0 (others may
        pass None) and broadcast from there, or with `rank0_only=False` given on every rank
        (each takes its shard; nothing is sent)."""
        names = _attribute_names(self.module)
        if state is not None or not rank0_only or self.rank == 0:
            if state is None:
                raise ValueError("load_full_state_dict needs the state on this rank: pass a "
                                 "full_state_dict(), or rank0_only=True with the state on rank 0")
            missing = [k for k in self._state_keys if k not in state]
            if missing:
                raise ValueError(f"state dict lacks {', '.join(missing[:5])}: pass a full_state_dict() "
                                 "of the same model")
        for group in self._groups():
            flat = torch.zeros(group.padded_numel, dtype=group.shard.dtype, device=group.shard.device)
            if state is not None:
                parts = [state[f"{names[id(owners[0][0])]}{owners[0][1]}"].reshape(-1).to(flat)
                         for owners in group.owners]
                flat[: group.numel].copy_(torch.cat(parts))
            if rank0_only:
                dist.broadcast(flat, src=self._source_rank, group=self.group)
            group.shard.copy_(flat[group.begin: group.begin + group.shard_numel])
        buffer_keys = [k for k in self._state_keys if k not in self._param_keys]
        shared = [{k: state[k] for k in buffer_keys} if state is not None else None]
        if rank0_only:
            dist.broadcast_object_list(shared, src=self._source_rank, group=self.group)
        self.module.load_state_dict(shared[0] or {}, strict=False)


def _attribute_names(model: nn.Module) -> dict[int, str]:
    """id(submodule) -> its state-dict prefix ('' for the model, 'layers.0.' ...)."""
    return {id(m): (f"{name}." if name else "") for name, m in model.named_modules(remove_duplicate=False)}


def _on_side_stream(stream: torch.cuda.Stream, work: Callable[[], None]) -> None:
    """Run `work` with `stream` current, after what the current stream of its device has queued;
    that stream is current again after (a plain switch: `torch.cuda.stream`'s context costs more
    host time, and the hooks switch several times per unit)."""
    current = torch.cuda.current_stream(stream.device_index)
    stream.wait_stream(current)
    torch.cuda.set_stream(stream)
    try:
        work()
    finally:
        torch.cuda.set_stream(current)


def _ranks(group: dist.ProcessGroup | None) -> list[int]:
    """The global ranks of `group` (None: the world), in its order."""
    return dist.get_process_group_ranks(group or dist.group.WORLD)


def _in_backward() -> bool:
    """Whether autograd is running a backward now (a checkpoint's recompute runs inside one)."""
    return torch._C._current_graph_task_id() != -1
