"""What a block keeps for its backward, decided per saved tensor: kept, rebuilt, or sent to the host.

`BlockFrame` runs one block's forward under `torch.autograd.graph.saved_tensors_hooks`. Each tensor
an op saves for backward goes one of three ways:

* **rebuilt** (selective recompute): the block's forward names cheap tensors with
  `rebuild_in_backward(target, rebuild, *sources)`, e.g. a norm's output as the norm of its input,
  which the norm saved anyway. When `target` is then saved, the frame stores the recipe instead
  and the backward runs ``rebuild(*sources)`` under no_grad when it needs the tensor: the same
  kernels on the same inputs, so the same values, and freed again after the node that read it.
  The sources are found among the tensors this block saved before, and a saved tensor takes the
  recipe only if it holds the target's values: both match by address, dtype and version, by size
  if contiguous (a norm saves its input as rows: that reshape serves) or else by shape and strides,
  and only while what was matched is alive (held weakly: a target's tensor, a source's storage, as
  a saved view such as those rows dies with the op that made it). So a transpose of a source, a
  target changed in place since, or a later tensor at a dead target's address is never taken for
  it. A target whose sources were not saved stays saved; a recipe that reads an offloaded source
  counts as one more unpack of it.
* **offloaded**: an activation (see `lmscope.model.offload`) is handed to the block's
  `OffloadFrame`, which copies it to host memory and brings it back for the backward;
* **kept**: anything else, passed on to the saved-tensor hooks that were active around the block
  (e.g. `lmscope.measure.saved_activations.SavedActivations`, which thus still sees what the block
  keeps on the device), or kept as is.

Why recipes rather than torch's selective checkpointing (`create_selective_checkpoint_contexts`):
SAC decides per aten op at dispatch and recomputes the block's forward up to what it cached.
lmscope's fast block runs RMSNorm, RoPE, SwiGLU and FlashAttention as Triton kernels inside
autograd Functions, invisible to SAC's dispatch cache, so its recompute would run flash attention
again, the costliest op of a long-context block. A recipe names exactly the tensor to drop and
the kernel that rebuilds it from what is saved anyway, and nothing else runs again. Eager blocks
(lmscope's TransformerBlock, transformers' layers) use SAC (`lmscope.model.checkpointing`).

Under CUDA-graph capture the hooks run while capturing and the recipes' kernels are captured into
the backward graph; offloading refuses to run there.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from lmscope.model.offload import OffloadFrame

REBUILD_RANGE = "rebuild"
"""torch.profiler range around a rebuilt tensor's kernels in the backward."""
_ACTIVE: list[BlockFrame] = []
"""Frames whose block forward is running, innermost last."""


def recording_recipes() -> bool:
    """Whether the innermost running block takes recipes (so building one is worth its host time)."""
    return bool(_ACTIVE) and _ACTIVE[-1].recipes


def rebuild_in_backward(target: torch.Tensor, rebuild: Callable[..., torch.Tensor],
                        *sources: torch.Tensor) -> None:
    """Inside a block run with selective recompute, save `target` as ``rebuild(*sources)``.

    `rebuild` must give `target`'s values from `sources` (tensors the block saved already), as a
    tensor of `target`'s number of elements; it runs under no_grad in the backward. Outside such
    a block (no frame, or one without recipes) this does nothing.
    """
    if recording_recipes():
        _ACTIVE[-1].add_recipe(target, rebuild, sources)


class _Kept:
    """A tensor saved as it is (or as the outer hooks packed it)."""

    __slots__ = ("inner", "outer_unpack")

    def __init__(self, inner: Any, outer_unpack: Callable[[Any], torch.Tensor] | None) -> None:
        self.inner, self.outer_unpack = inner, outer_unpack

    def again(self) -> _Kept:
        """A handle for one more unpack (a recipe that reads it): this one, which counts none."""
        return self

    def unpack(self) -> torch.Tensor:
        return self.outer_unpack(self.inner) if self.outer_unpack is not None else self.inner


class _Rebuilt:
    """A tensor saved as a recipe: rebuilt from its sources' saved handles when unpacked."""

    __slots__ = ("rebuild", "sources", "shape")

    def __init__(self, rebuild: Callable[..., torch.Tensor], sources: list[Any], shape: torch.Size) -> None:
        self.rebuild, self.sources, self.shape = rebuild, sources, shape

    def unpack(self) -> torch.Tensor:
        with torch.no_grad(), torch.profiler.record_function(REBUILD_RANGE):
            return self.rebuild(*(source.unpack() for source in self.sources)).reshape(self.shape)


class _Recipe:
    """How to rebuild one target tensor (held weakly): a `_Rebuilt` handle each time it is saved."""

    __slots__ = ("target", "rebuild", "sources")

    def __init__(self, target: torch.Tensor, rebuild: Callable[..., torch.Tensor],
                 sources: list[Any]) -> None:
        self.target, self.rebuild, self.sources = weakref.ref(target), rebuild, sources

    def handle(self, shape: torch.Size) -> _Rebuilt:
        """A saved handle of `shape`; each source is unpacked once more for it (an offloaded one
        counts that, so its device copy stays until the rebuild has read it)."""
        return _Rebuilt(self.rebuild, [source.again() for source in self.sources], shape)


def _identity(tensor: torch.Tensor) -> tuple:
    """Equal for two live tensors that hold the same values in the same order: address, dtype and
    version, and the size of a contiguous tensor (a reshape of a source, such as the rows a norm
    saves, serves as the source), or the shape and strides of another (a transpose does not)."""
    layout = (tensor.numel(),) if tensor.is_contiguous() else (tuple(tensor.shape), tensor.stride())
    return tensor.data_ptr(), tensor.dtype, tensor._version, layout


def _outer_hooks() -> tuple[Callable, Callable] | None:
    """The saved-tensor hooks active around the block (private torch API; None if missing)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top(False) if top is not None else None


class BlockFrame:
    """The saved-tensor hooks of one block's forward (a context manager; see the module docstring)."""

    def __init__(self, *, recipes: bool, offload: OffloadFrame | None) -> None:
        self.recipes = recipes
        self.offload = offload
        self._recipes: dict[tuple, _Recipe] = {}
        self._saved: dict[tuple, tuple[weakref.ref, Any]] = {}
        """The storages of the tensors this block saved (held weakly) and their handles by
        `_identity`: the sources of recipes."""
        self._outer = _outer_hooks()
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None

    def __enter__(self) -> BlockFrame:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        """End the forward and let go of everything: the hooks hold this frame's `_pack` (a cycle
        until now), the offload frame and the handles belong to the backward's graph from here."""
        _ACTIVE.remove(self)
        hooks, self._hooks, self.offload = self._hooks, None, None
        if hooks is not None:
            hooks.__exit__(*exc)
        self._saved.clear()
        self._recipes.clear()

    def add_recipe(self, target: torch.Tensor, rebuild: Callable[..., torch.Tensor],
                   sources: tuple[torch.Tensor, ...]) -> None:
        handles = [self._handle_of(source) for source in sources]
        if any(h is None for h in handles) or not target.is_contiguous():
            return  # not rebuildable from what this block saved: it stays saved
        self._recipes[_identity(target)] = _Recipe(target, rebuild, handles)

    def _handle_of(self, tensor: torch.Tensor) -> Any:
        """The handle of a tensor this block saved with `tensor`'s values, its storage alive (None if
        none). The storage, not the saved tensor: that may be a view its op made and dropped (a
        kernel saves its input as rows), while the handle, or the offload frame, holds the bytes."""
        saved, handle = self._saved.get(_identity(tensor), (None, None))
        return handle if saved is not None and saved() is not None else None

    def _pack(self, tensor: torch.Tensor) -> Any:
        recipe = self._recipes.get(_identity(tensor)) if self._recipes else None
        if recipe is not None and recipe.target() is not None:  # a dead target's address is reused
            return recipe.handle(tensor.shape)
        if self.offload is not None and self.offload.takes(tensor):
            handle: Any = self.offload.pack(tensor)
        elif self._outer is not None:
            handle = _Kept(self._outer[0](tensor), self._outer[1])
        else:  # detached: a tensor its own node saves (an output) would otherwise hold that node,
            # a cycle through autograd's C++ graph that Python's collector cannot see, and a
            # forward that never runs its backward (an exception, say) would keep it all
            handle = _Kept(tensor.detach(), None)
        if self.recipes:
            self._saved[_identity(tensor)] = (weakref.ref(tensor.untyped_storage()), handle)
        return handle


def _unpack(handle: Any) -> torch.Tensor:
    return handle.unpack()
