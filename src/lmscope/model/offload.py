"""Saved activations of chosen blocks held in host memory from their forward to their backward.

`Offloader` serves the blocks of one model that a `--checkpoint` policy offloads (`offload[:LIST]`);
each forward of such a block gets an `OffloadFrame` (through `lmscope.model.saved_tensors.BlockFrame`):

* **What moves.** Activations only: floating tensors whose leading dims carry the batch's tokens
  (first dim batch * seq; or a multiple of batch, as batch or batch * heads, with seq as the second
  or third dim, as (batch, heads, seq, dim)), the batch and sequence sizes read from the block's
  first input of two or more dims. Never the block's parameters, buffers or other tensor
  attributes (FSDP's gathered views, say), inputs that need no gradient (RoPE tables, the fast
  model's bf16 weight stacks, masks), nor casts and views of a weight (autocast's copies): those
  stay as they are. A weight copy made inside an autograd Function (the fast model's stacked
  matmul weights under FSDP) is told apart by its shape only: it moves too if its first dim
  happens to be batch * seq, or its second seq.
* **Forward.** A saved activation's storage is copied once (several tensors viewing it share the
  copy) into pinned host memory on a side stream, after an event on the compute stream; the
  storage is marked used by the side stream (`record_stream`), so the caching allocator reuses it
  only after the copy. Pinned buffers come from torch's caching host allocator and are reused
  across steps. At the end of the block's forward the compute stream waits for the previous
  block's copies: at most two blocks' copies are in flight, so a host link slower than the
  forward shows up as time, not as memory piling up.
* **Backward.** When the first gradient of the block's outputs arrives (just before its
  backward), its copies are brought back on the side stream unless they are on the way already,
  and so are the previous block's when it is offloaded too (a prefetch, one block ahead), once per
  forward: an output whose gradient arrives later (the fast block's residual comes from a norm
  that runs midway through its backward) brings nothing back. An unpack waits for its copy's
  event on the compute stream; a storage's device copy is let go once every handle of it has
  been unpacked (one per saved tensor, one more per recipe that rebuilds a tensor from it), and a
  storage is copied back at most once per backward.
* **Lifetime.** The references form no cycle: the saved handles hold the host copies, and the
  frame holds them (and the previous block's frame) only until its prefetch has run, so a step's
  copies are freed by reference counting when its backward ends, not by Python's cyclic garbage
  collector some steps later.

On the CPU the same path runs without streams: the "host" copy is a second CPU tensor (a clone),
which frees nothing but lets tests check that values and gradients are unchanged. Offloading
cannot run under CUDA-graph capture (host copies and events per step): it refuses with one line.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from lmscope.model.tensor_leaves import tensors_in

CAPTURE_REFUSAL = ("activation offload copies to host memory every step and cannot be captured in a "
                   "CUDA graph: drop offload from --checkpoint or run without CUDA graphs")


def _storage(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


class Offloader:
    """The offloaded blocks of one model: a side stream per device and the chain of frames."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._last: weakref.ref[OffloadFrame] | None = None

    def side_stream(self, device: torch.device) -> torch.cuda.Stream | None:
        """The copy stream of a CUDA device (None on the CPU: copies are synchronous)."""
        if device.type != "cuda":
            return None
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def frame(self, index: int, block: nn.Module, args: tuple, kwargs: dict) -> OffloadFrame:
        """A new frame for block `index`'s forward with these inputs."""
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(CAPTURE_REFUSAL)
        last = self._last() if self._last is not None else None
        previous = last if last is not None and last.index == index - 1 else None
        frame = OffloadFrame(self, index, _stay(block, args, kwargs), _tokens(args, kwargs), previous)
        self._last = weakref.ref(frame)
        return frame


def _stay(block: nn.Module, args: tuple, kwargs: dict) -> set[int]:
    """Storages that are not activations: the block's tensors and its inputs that need no grad."""
    keep: set[int] = set()
    for module in block.modules():  # parameters, buffers and plain tensor attributes
        keep.update(_storage(t) for t in tensors_in(list(vars(module).values())))
    keep.update(_storage(t) for t in tensors_in([args, kwargs]) if not t.requires_grad)
    return keep


def _tokens(args: tuple, kwargs: dict) -> tuple[int, int] | None:
    """(batch, seq) of the block's first floating input with two or more dims."""
    for tensor in tensors_in([args, kwargs]):
        if tensor.is_floating_point() and tensor.dim() >= 2:
            return tensor.shape[0], tensor.shape[1]
    return None


_WEIGHT_PATH = frozenset({"ToCopyBackward0", "TBackward0", "ViewBackward0", "UnsafeViewBackward0",
                          "ExpandBackward0", "PermuteBackward0", "TransposeBackward0", "AliasBackward0"})


def _is_weight(tensor: torch.Tensor) -> bool:
    """A leaf that needs grad reached through casts and views only (autocast's weight copy, say)."""
    node = tensor.grad_fn
    for _ in range(4):
        if node is None:
            return False
        if node.name() == "torch::autograd::AccumulateGrad":
            return True
        if node.name() not in _WEIGHT_PATH or len(node.next_functions) != 1:
            return False
        node = node.next_functions[0][0]
    return False


class _HostCopy:
    """One storage's bytes in host memory, and its device copy while the backward needs it."""

    def __init__(self, tensor: torch.Tensor, side: torch.cuda.Stream | None) -> None:
        self.device = tensor.device
        self.side = side
        storage = tensor.untyped_storage()
        source = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
        self.host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=side is not None)
        if side is None:
            self.host.copy_(source)
        else:
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.host.copy_(source, non_blocking=True)
            source.record_stream(side)
        self.on_device: torch.Tensor | None = None
        self.ready: torch.cuda.Event | None = None
        self.unpacks_left = 0
        """Handles of this storage not unpacked yet (one per saved tensor, and per recipe reading one)."""
        self.loads = 0
        """Times the bytes were copied back to the device: once per backward."""

    def prefetch(self) -> None:
        """Start the copy back to the device ahead of the unpacks, unless it is there already or
        every unpack is done (a prefetch after the block's backward would only hold memory)."""
        if self.on_device is None and self.unpacks_left > 0:
            self._bring_back()

    def _bring_back(self) -> torch.Tensor:
        self.loads += 1
        if self.side is None:
            self.on_device = self.host.clone()
            return self.on_device
        compute = torch.cuda.current_stream(self.device)
        on_device = torch.empty(self.host.shape, dtype=torch.uint8, device=self.device)
        self.side.wait_stream(compute)  # the memory may have been compute's until now
        with torch.cuda.stream(self.side):
            on_device.copy_(self.host, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record(self.side)
        on_device.record_stream(self.side)
        self.on_device = on_device
        return on_device

    def view(self, offset: int, size: torch.Size, stride: tuple[int, ...],
             dtype: torch.dtype) -> torch.Tensor:
        """The saved tensor, back on the device (waits for its copy on the compute stream). Copied
        now if no prefetch brought it (a backward again through a retained graph, say)."""
        on_device = self.on_device if self.on_device is not None else self._bring_back()
        if self.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready)
        self.unpacks_left -= 1
        if self.unpacks_left <= 0:  # the unpacked tensors hold it while autograd needs them
            self.on_device, self.ready = None, None
        return torch.empty(0, dtype=dtype, device=self.device).set_(
            on_device.untyped_storage(), offset, size, stride)


class _Offloaded:
    """A saved tensor as a view of a host copy."""

    __slots__ = ("copy", "offset", "size", "stride", "dtype")

    def __init__(self, copy: _HostCopy, offset: int, size: torch.Size, stride: tuple[int, ...],
                 dtype: torch.dtype) -> None:
        self.copy, self.offset, self.size, self.stride, self.dtype = copy, offset, size, stride, dtype
        copy.unpacks_left += 1

    def again(self) -> _Offloaded:
        """Another handle to the same tensor, for one more unpack (a recipe that reads it)."""
        return _Offloaded(self.copy, self.offset, self.size, self.stride, self.dtype)

    def unpack(self) -> torch.Tensor:
        return self.copy.view(self.offset, self.size, self.stride, self.dtype)


class OffloadFrame:
    """One offloaded block's forward: its host copies, their event, the previous block's frame."""

    def __init__(self, offloader: Offloader, index: int, stay: set[int], tokens: tuple[int, int] | None,
                 previous: OffloadFrame | None) -> None:
        self.offloader, self.index, self.previous = offloader, index, previous
        self._stay, self._tokens = stay, tokens
        self._copies: dict[int, _HostCopy] = {}
        self._sources: list[torch.Tensor] = []
        """The offloaded tensors, alive until the forward ends: no address is reused meanwhile,
        so storages are told apart by address (and recipes find their sources)."""
        self.copied: torch.cuda.Event | None = None

    def takes(self, tensor: torch.Tensor) -> bool:
        """Whether a saved tensor is an activation this frame offloads (see the module docstring)."""
        if self._tokens is None or not tensor.is_floating_point() or tensor.dim() == 0:
            return False
        batch, seq = self._tokens
        shape = tensor.shape
        if not (shape[0] == batch * seq or (shape[0] % batch == 0 and seq in shape[1:3])):
            return False
        return _storage(tensor) not in self._stay and not _is_weight(tensor)

    def pack(self, tensor: torch.Tensor) -> _Offloaded:
        key = _storage(tensor)
        if key not in self._copies:
            self._copies[key] = _HostCopy(tensor, self.offloader.side_stream(tensor.device))
            self._sources.append(tensor)
        return _Offloaded(self._copies[key], tensor.storage_offset(), tensor.shape, tensor.stride(),
                          tensor.dtype)

    def finish_forward(self, outputs: Any) -> None:
        """After the block's forward: bound the copies in flight, arm the backward's prefetch."""
        self._sources.clear()
        side = next((c.side for c in self._copies.values() if c.side is not None), None)
        if side is not None:
            self.copied = torch.cuda.Event()
            self.copied.record(side)
        if self.previous is not None and self.previous.copied is not None:
            device = next(c.device for c in self.previous._copies.values())
            torch.cuda.current_stream(device).wait_event(self.previous.copied)
        for tensor in tensors_in(outputs):
            if tensor.requires_grad:
                tensor.register_hook(self._backward_starts)

    def _backward_starts(self, grad: torch.Tensor) -> None:
        """The first gradient of an output arrived: prefetch this block's copies and the previous
        block's, once. The frame then lets go of both (the saved handles hold the copies), so
        nothing of it outlives the backward and a later output's gradient (one that arrives
        midway through the block's backward) finds nothing left to bring back."""
        self.prefetch()
        if self.previous is not None:
            self.previous.prefetch()
        self._copies, self.previous = {}, None

    def prefetch(self) -> None:
        for copy in self._copies.values():
            copy.prefetch()
