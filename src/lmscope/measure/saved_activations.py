"""What autograd saves for backward, measured on any nn.Module: by block, by module and by op.

`SavedActivations(model)` registers forward pre/post hooks on every submodule (a stack of the
modules running) and, inside `recording()`, a `torch.autograd.graph.saved_tensors_hooks` pair:

* pack (forward): each saved tensor is attributed to the innermost module running when it is
  saved (a module shared by several parents, such as one RoPE for all blocks, under the parent
  that called it) and counted once per storage (a view of a storage already saved adds nothing; the whole
  storage counts, as the allocator holds it). Storages of the model's parameters and buffers, and
  of autocast's low-precision weight copies (a cast or view of a parameter), are not activations:
  they are counted apart (`weight_copy_bytes`). Integer tensors (token ids, targets, indices) and
  0-d tensors are counted apart too (`other_bytes`).
* unpack (backward): the autograd node that reads a saved tensor (`_current_autograd_node()`) is
  its op kind (`MmBackward0`, `SoftmaxBackward0`, ...); a storage takes the node of the first
  tensor saved from it. Storages the backward never reads stay `(not unpacked)`.

A module's block is its outermost ancestor that is an entry of an `nn.ModuleList` (`layers.3`,
`transformer.h.3`), else its top-level child (`lm_head`), else `(outside modules)` (e.g. the loss).
A block checkpointed with torch.utils.checkpoint shows its inputs only (the checkpoint keeps them;
what its ops save goes through the checkpoint's own hooks). Blocks under lmscope's selective
recompute or offload (`lmscope.model.saved_tensors`) hand what they keep on the device to the hooks
around them, so it shows here; rebuilt and offloaded tensors do not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

OUTSIDE = "(outside modules)"
NOT_UNPACKED = "(not unpacked)"
_WEIGHT_VIEWS = frozenset({
    "ToCopyBackward0", "TBackward0", "ViewBackward0", "UnsafeViewBackward0", "ExpandBackward0",
    "PermuteBackward0", "TransposeBackward0", "AliasBackward0",
})
"""Nodes between a parameter and a tensor that is still 'the weight' (autocast's cast, a transpose)."""


@dataclass
class _Saved:
    """One storage saved for backward: its bytes, who saved it first, which node reads it."""

    nbytes: int
    module: str
    block: str
    op: str = NOT_UNPACKED


class SavedActivations:
    """Measure the tensors a forward saves for backward (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.saved: dict[int, _Saved] = {}
        """Activation storages by storage key, in the order they were first saved."""
        self.weight_copy_bytes = 0
        """Autocast's casts of parameters saved by matmuls (counted once per storage)."""
        self.other_bytes = 0
        """Integer and 0-d tensors saved (token ids, targets, scalars)."""
        self._own = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
        self._params = {id(p) for p in model.parameters()}
        self._seen_other: set[int] = set()
        self._ops: list[str | None] = []
        self._storage_of_pack: list[int | None] = []
        self._stack: list[str] = []
        self._blocks = _block_names(model)

    @contextlib.contextmanager
    def recording(self) -> Iterator[SavedActivations]:
        """Attribute what the forward inside saves; the backward may run after leaving it."""
        names: dict[nn.Module, list[str]] = {}
        for name, module in self.model.named_modules(remove_duplicate=False):
            names.setdefault(module, []).append(name)
        handles = []
        for module, paths in names.items():
            handles.append(module.register_forward_pre_hook(lambda m, a, paths=paths: self._push(paths)))
            handles.append(module.register_forward_hook(lambda m, a, o: self._pop(), always_call=True))
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            for handle in handles:
                handle.remove()
            self._stack.clear()

    def _push(self, paths: list[str]) -> None:
        """Enter a module; a shared one (e.g. one RoPE in every block) takes the path under its caller."""
        parent = self._stack[-1] + "." if self._stack and self._stack[-1] else ""
        self._stack.append(next((p for p in paths if p.startswith(parent)), paths[0]))

    def _pop(self) -> None:
        if self._stack:
            self._stack.pop()

    def _pack(self, tensor: torch.Tensor) -> tuple[int, torch.Tensor]:
        index = len(self._ops)
        self._ops.append(None)
        self._storage_of_pack.append(self._count(tensor))
        return index, tensor

    def _unpack(self, packed: tuple[int, torch.Tensor]) -> torch.Tensor:
        index, tensor = packed
        if self._ops[index] is None:
            node = torch._C._current_autograd_node()
            self._ops[index] = node.name() if node is not None else NOT_UNPACKED
            key = self._storage_of_pack[index]
            if key is not None and self.saved[key].op == NOT_UNPACKED:
                self.saved[key].op = self._ops[index]
        return tensor

    def _count(self, tensor: torch.Tensor) -> int | None:
        """Book a saved tensor; returns its storage key when it is a (new or known) activation."""
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return None
        key = storage._cdata
        if key in self._own:
            return None
        if key in self.saved:
            return key
        if key in self._seen_other:
            return None
        if self._is_weight(tensor):
            self._seen_other.add(key)
            self.weight_copy_bytes += storage.nbytes()
            return None
        if tensor.dim() == 0 or not (tensor.is_floating_point() or tensor.dtype == torch.bool):
            self._seen_other.add(key)
            self.other_bytes += storage.nbytes()
            return None
        module = self._stack[-1] if self._stack else OUTSIDE
        self.saved[key] = _Saved(nbytes=storage.nbytes(), module=module or OUTSIDE,
                                 block=self._block_of(module))
        return key

    def _is_weight(self, tensor: torch.Tensor) -> bool:
        """A parameter reached through casts and views only (autocast's cached weight copy)."""
        node = tensor.grad_fn
        for _ in range(4):
            if node is None:
                return False
            if node.name() == "torch::autograd::AccumulateGrad":
                return id(node.variable) in self._params
            if node.name() not in _WEIGHT_VIEWS:
                return False
            inputs = [n for n, _ in node.next_functions if n is not None]
            if len(inputs) != 1:
                return False
            node = inputs[0]
        return False

    def _block_of(self, module: str) -> str:
        if not module:
            return OUTSIDE
        for block in self._blocks:
            if module == block or module.startswith(block + "."):
                return block
        return module.split(".")[0]

    # ------------------------------------------------------------------ results

    @property
    def total_bytes(self) -> int:
        """Bytes of the distinct activation storages saved."""
        return sum(s.nbytes for s in self.saved.values())

    def by(self, attribute: str) -> dict[str, int]:
        """Saved bytes grouped by 'block', 'module' or 'op', in the order first seen."""
        groups: dict[str, int] = {}
        for saved in self.saved.values():
            key = getattr(saved, attribute)
            groups[key] = groups.get(key, 0) + saved.nbytes
        return groups

    def gradient_bytes(self) -> dict[str, int]:
        """Bytes of the parameters' .grad by block (call after backward), each storage once."""
        groups: dict[str, int] = {}
        seen: set[int] = set()
        for name, parameter in self.model.named_parameters():
            grad = parameter.grad
            if grad is None or grad.untyped_storage()._cdata in seen:
                continue
            seen.add(grad.untyped_storage()._cdata)
            block = self._block_of(name.rpartition(".")[0])
            groups[block] = groups.get(block, 0) + grad.untyped_storage().nbytes()
        return groups

    def as_record(self, top_ops: int = 10) -> dict[str, Any]:
        """Flat fields: totals in GiB, per-block and top-op lists in MiB."""
        mib, gib = 2**20, 2**30
        total = self.total_bytes
        ops = sorted(self.by("op").items(), key=lambda kv: -kv[1])[:top_ops]
        modules = sorted(self.by("module").items(), key=lambda kv: -kv[1])
        grads = self.gradient_bytes()
        return {
            "saved_activations_gib": total / gib,
            "saved_weight_copies_gib": self.weight_copy_bytes / gib,
            "saved_other_mib": self.other_bytes / mib,
            "saved_by_block": [{"block": k, "saved_mib": v / mib} for k, v in self.by("block").items()],
            "saved_by_op": [{"op": k, "saved_mib": v / mib, "share_pct": 100.0 * v / total if total else None}
                            for k, v in ops],
            "saved_by_module": [{"module": k, "saved_mib": v / mib} for k, v in modules],
            "gradients_gib": sum(grads.values()) / gib,
            "gradients_by_block": [{"block": k, "grad_mib": v / mib} for k, v in grads.items()],
        }


def _block_names(model: nn.Module) -> list[str]:
    """Names of the entries of the outermost ModuleLists (the model's repeated blocks)."""
    blocks: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name.startswith(b + ".") for b in blocks):
            blocks.extend(f"{name}.{child}" if name else child for child, _ in module.named_children())
    return blocks


def unique_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages among `tensors` (an iterable of tensors, Nones skipped)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())
