"""Predicted memory of a training step of lmscope's fast model, with per-block treatments.

The fast block (`lmscope.model.fast_transformer.FastTransformerBlock`) saves much less than the
eager block that `lmscope.accounting.memory` replays: its kernels save only what their backward
reads. Per block and token, with d = d_model, f = d_ff, h = heads, c bytes per compute element
and 4 for the fp32 residual stream, its forward saves:

* at each of its two norms (add_rmsnorm, the residual add fused in) the residual s (4 d) and
  1/rms (4); the matmul after the norm saves the norm's output (c d);
* attention: the RoPE'd q, k, v and the output o (4 c d); lmscope's flash kernel writes o in the
  layout the output projection reads (a view, no copy) and keeps its log-sum-exp in one fp32
  buffer with the backward's row sums (4 (h, padded to 64 floats per batch, + h)); SDPA keeps
  its log-sum-exp (4 h) and the output projection saves a (batch, seq, d) copy of o (c d);
* SwiGLU its input gate_up (2 c f); w2 SwiGLU's output (c f);
* weight copies per forward, by where the weights come from (`WEIGHT_COPIES`): none with
  persistent copies (`shadows`: the single-GPU fast path under autocast); the stacks of
  [Wq; Wk; Wv] and [w1; w3] (`stacks`: FSDP's gathered compute-dtype weights, or fp32); all four
  matmuls' casts (`casts`: autocast over fp32 weights without persistent copies).

Treatments (`lmscope.accounting.treatments`): full keeps the block's inputs (x, 4 d; after the
first block also the pending FFN output, c d) and recomputes the block before its backward;
selective keeps all but the two norm outputs, SwiGLU's output and the copy of o, which the
backward rebuilds when it reads them; offload moves every saved activation (not the weight
copies nor flash's buffer, whose first dim is not the tokens) to the host once the next block's
forward has ended and fetches it for the backward (prefetched during the next block's backward
when that one is offloaded too).

The step: the embedding output, the blocks, the final norm and the fused LM head +
cross-entropy, which computes its gradients in the forward (d(hidden), c d per token, and
d(weight), V d in the weight's dtype, into which each chunk's matmul accumulates: no per-chunk
V d part) and holds one chunk of logits at a time; then the backward, node by node per block
with its gradient temporaries. On one device the fp32 gradients appear block by block; under
FSDP (`world_size` > 1) each unit's shard gradient does, and the rest of the static memory
(master shards; AdamW's moments on the device: all, or with `optimizer_state="host"` the root's,
the first unit's and those in flight; the gathered window; the gradient being reduce-scattered)
is `lmscope.accounting.fsdp`'s.

Not modelled: the allocator's rounding, cuBLAS workspaces, the flash backward's scratch, the
fused loss's per-chunk temporaries beyond one chunk; offload assumes the copies keep pace (at
most two blocks' copies in flight, which `lmscope.model.offload` enforces).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from lmscope.accounting.flops import parameter_counts
from lmscope.accounting.fsdp import check_optimizer_state, predict_fsdp
from lmscope.accounting.ledger import Ledger, Segment, record
from lmscope.accounting.treatment_cost import BlockBytes
from lmscope.accounting.treatments import FULL, NONE, SELECTIVE, parse_treatments
from lmscope.config import ModelConfig

COMPUTE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
WEIGHT_COPIES = ("shadows", "stacks", "casts")
"""Where the block matmuls' weights come from: persistent copies, stacked per forward, cast per forward."""
CHUNK_BYTES = 256 * 2**20
"""The fused cross-entropy's largest chunk of logits (lmscope.kernels.fused_cross_entropy)."""
CHUNK_MIN_TOKENS = 256



@dataclass(frozen=True)
class _Fast:
    """Byte sizes of one fast block's tensors for one config, batch, precision and setting."""

    config: ModelConfig
    batch: int
    seq: int
    c: int
    flash: bool
    weight_copies: str
    world_size: int
    keeps_grads: bool = True
    """Whether the backward leaves fp32 (shard) gradients: not with host optimizer state, which
    updates each unit from its reduced gradient."""

    @property
    def n(self) -> int:
        return self.batch * self.seq

    @property
    def res(self) -> int:
        return 4 * self.n * self.config.d_model

    @property
    def act(self) -> int:
        return self.c * self.n * self.config.d_model

    @property
    def ffn(self) -> int:
        return self.c * self.n * self.config.d_ff

    @property
    def rows(self) -> int:
        return 4 * self.n

    @property
    def attn_rows(self) -> int:
        """Flash's buffer (L padded to 64 floats, then the row sums D), or SDPA's L."""
        rows = self.batch * self.config.num_heads * self.seq
        return 4 * (math.ceil(rows / 64) * 64 + rows) if self.flash else 4 * rows

    @property
    def o_copy(self) -> int:
        """The output projection's (batch, seq, d) copy of o (none for flash: a view)."""
        return 0 if self.flash else self.act

    @property
    def copies(self) -> tuple[int, int, int, int]:
        """Weight copies a forward makes for [Wq; Wk; Wv], Wo, [w1; w3], w2."""
        d, f = self.config.d_model, self.config.d_ff
        if self.weight_copies == "shadows":
            return 0, 0, 0, 0
        qkv, w13 = self.c * 3 * d * d, self.c * 2 * f * d
        if self.weight_copies == "stacks":
            return qkv, 0, w13, 0
        return qkv, self.c * d * d, w13, self.c * f * d

    @property
    def block_grads(self) -> int:
        """fp32 gradient bytes a block's backward leaves (FSDP: its shard's)."""
        d, f = self.config.d_model, self.config.d_ff
        params = 2 * d + 4 * d * d + 3 * d * f
        return 4 * math.ceil(params / self.world_size) if self.keeps_grads else 0


# ---------------------------------------------------------------- what a block keeps


def saved_by_block(s: _Fast, kind: str) -> dict[str, int]:
    """What one (not first) block of `kind` keeps for its backward at the end of its forward."""
    if kind == FULL:
        return {"checkpoint_inputs": s.res + s.act}
    rebuilt = kind == SELECTIVE
    return {
        "residual": 2 * s.res,
        "norm_rstd": 2 * s.rows,
        "norm_output": 0 if rebuilt else 2 * s.act,
        "attention": 4 * s.act,
        "attention_rows": s.attn_rows,
        "attention_copy": 0 if rebuilt else s.o_copy,
        "ffn": 2 * s.ffn,
        "ffn_output": 0 if rebuilt else s.ffn,
        "weight_copies": sum(s.copies),
    }


def stays_on_device(s: _Fast) -> tuple[str, ...]:
    """What offloading leaves on the device: weight copies, and flash's buffer (its first dim is not
    the tokens; SDPA's log-sum-exp, (batch, heads, seq), moves)."""
    return ("attention_rows", "weight_copies") if s.flash else ("weight_copies",)


def _moved(s: _Fast, kind: str, first: bool, before_full: bool) -> int:
    """Bytes offloading a block moves to the host. A fully checkpointed block's input x moves
    only when nobody else saves it (the first block, or after another fully checkpointed one)."""
    if kind == FULL:
        return (s.res if first or before_full else 0) + (0 if first else s.act)
    return sum(v for k, v in saved_by_block(s, kind).items() if k not in stays_on_device(s))


def fast_block_bytes(s: _Fast) -> BlockBytes:
    """What offloading moves per block by kind, and the traffic of selective's rebuilt work: each
    norm reads its residual and writes its output and 1/rms, SwiGLU reads gate_up and writes its
    output, and (SDPA) the heads' copy reads and writes o."""
    d, f, n, c = s.config.d_model, s.config.d_ff, s.n, s.c
    traffic = n * (2 * (4 * d + c * d + 4) + 3 * c * f) + 2 * s.o_copy
    return BlockBytes(moved={kind: _moved(s, kind, False, True) for kind in (NONE, FULL, SELECTIVE)},
                      rebuild_traffic=traffic)


# ---------------------------------------------------------------- one block, forward and backward


def _block_forward(led: Ledger, s: _Fast, kind: str, before: str | None, recompute: bool = False) -> None:
    """One block from the live x (and pending) to the new x (and pending, unless `recompute`).

    before: the previous block's kind (None for the first block), which says whether x stays alive
    after this block reads it (the previous block saved it as its second residual).
    """
    first = before is None
    save, keep = kind != FULL, kind == NONE
    qkv_w, o_w, w13_w, w2_w = s.copies
    if kind == FULL:
        led.adopt("checkpoint_inputs", s.res + (0 if first else s.act))
    if first:
        led.adopt("residual", s.res if save else 0)  # rmsnorm saves x itself
    else:
        led.hold("residual", s.res, save)  # s1 = x + pending
        if kind != FULL and not recompute:
            led.free(s.act)  # pending consumed
            if before == FULL:
                led.free(s.res)  # x: nobody saved it
    led.hold("norm_rstd", s.rows, save)
    led.hold("norm_output", s.act, keep)
    led.hold("weight_copies", qkv_w, save)
    led.alloc(3 * s.act)  # packed q, k, v projections
    led.drop(s.act, keep)  # the norm output, read
    led.hold("attention", 3 * s.act, save)  # RoPE'd q, k, v
    led.free(3 * s.act)
    led.hold("attention", s.act, save)  # o
    led.hold("attention_rows", s.attn_rows, save)
    led.hold("attention_copy", s.o_copy, keep)
    led.hold("weight_copies", o_w, save)
    led.alloc(s.act)  # the output projection
    led.drop(s.o_copy, keep)
    led.drop(4 * s.act + s.attn_rows + qkv_w + o_w, save)
    led.hold("residual", s.res, save)  # s2 = s1 + attention output: the block's new x
    led.free(s.act)
    if not first:
        led.drop(s.res, save)  # s1
    led.hold("norm_rstd", s.rows, save)
    led.drop(2 * s.rows, save)
    led.hold("norm_output", s.act, keep)
    led.hold("weight_copies", w13_w, save)
    led.hold("ffn", 2 * s.ffn, save)  # gate_up
    led.drop(s.act, keep)
    led.hold("ffn_output", s.ffn, keep)
    led.hold("weight_copies", w2_w, save)
    if not recompute:
        led.alloc(s.act)  # w2: the new pending
    led.drop(s.ffn, keep)
    led.drop(2 * s.ffn + w13_w + w2_w, save)


def _block_backward(led: Ledger, s: _Fast, kind: str, before: str | None) -> None:
    """From the live grads of x (4 d) and pending (c d): each node's gradients, the release of
    what it read; selective's rebuilt tensors are allocated where they are read."""
    first = before is None
    rebuilt = kind == SELECTIVE
    qkv_w, o_w, w13_w, w2_w = s.copies
    led.alloc(s.ffn if rebuilt else 0)  # SwiGLU's output, rebuilt
    led.alloc(s.ffn)  # w2 backward: its gradient
    led.alloc(s.block_grads)  # the block's fp32 gradients (kept)
    led.free(s.act + s.ffn + w2_w)  # grad of pending, SwiGLU's output, w2's copy
    led.alloc(2 * s.ffn)  # SwiGLU backward: d gate_up
    led.free(3 * s.ffn)  # d output, gate_up
    led.alloc(s.act if rebuilt else 0)  # the second norm's output, rebuilt
    led.alloc(s.act)  # [w1; w3] backward: d norm output
    led.free(2 * s.ffn + s.act + w13_w)
    led.alloc(s.res + s.act)  # second norm backward: d s1, d attention output
    led.free(s.res + s.act + s.res + s.rows)  # grad of x, d norm output, s2, 1/rms
    led.alloc(s.o_copy if rebuilt else 0)  # the copy of o, rebuilt
    led.alloc(s.act)  # output projection backward: d o
    led.free(s.act + s.o_copy + o_w)
    led.alloc(3 * s.act)  # attention backward: dq, dk, dv
    led.free(5 * s.act + s.attn_rows)  # d o, q, k, v, o, L
    led.alloc(3 * s.act)  # RoPE backward: d qkv
    led.free(3 * s.act)
    led.alloc(s.act if rebuilt else 0)  # the first norm's output, rebuilt
    led.alloc(s.act)  # [Wq; Wk; Wv] backward: d norm output
    led.free(4 * s.act + qkv_w)
    led.alloc(s.res + (0 if first else s.act))  # first norm backward: d x, d pending
    led.free(s.act + s.res + s.res + s.rows)  # d norm output, d s1, s1 (x for the first), 1/rms
    if kind == FULL:
        led.free(0 if first else s.act)  # the checkpoint's pending
        if before == FULL:
            led.free(s.res)  # the checkpoint's x, saved by nobody else


@functools.lru_cache(maxsize=1024)
def _forward_segment(s: _Fast, kind: str, before: str | None, offload: int) -> Segment:
    """A block's forward; then `offload` bytes (the previous block's copies) leave the device."""

    def run(led: Ledger) -> None:
        _block_forward(led, s, kind, before)
        led.offload(offload)

    return record(run)


@functools.lru_cache(maxsize=1024)
def _backward_segment(s: _Fast, kind: str, before: str | None, fetch: int) -> Segment:
    """`fetch` offloaded bytes back, the recompute of a fully checkpointed block, its backward."""

    def run(led: Ledger) -> None:
        led.fetch(fetch)
        if kind == FULL:  # recompute up to w2's saved input; the checkpoint holds x and pending
            _block_forward(led, s, NONE, before, recompute=True)
        _block_backward(led, s, kind, before)

    return record(run)


# ---------------------------------------------------------------- the step


@dataclass(frozen=True)
class FastMemoryPrediction:
    """Predicted allocated bytes per device of a fast-model training step."""

    static: int
    """Allocated before the step: parameters or master shards, optimizer state, persistent
    copies, buffers, the batch; under FSDP also the largest gathered window."""
    forward_peak: int
    backward_peak: int
    step_peak: int
    activations: int
    """Kept for backward on the device at the end of the forward (blocks and the loss)."""
    offloaded: int
    """Kept for backward in host memory at the end of the forward."""

    def as_record(self) -> dict[str, float]:
        gib = 2**30
        return {f"predicted_fast_{name}_gib": getattr(self, name) / gib
                for name in ("static", "forward_peak", "backward_peak", "step_peak", "activations",
                             "offloaded")}


def fast_dims(config: ModelConfig, *, batch_size: int, seq_len: int, precision: str, attention: str,
              world_size: int = 1, weight_copies: str | None = None) -> _Fast:
    """The sizes the fast model's accounting works with; weight_copies defaults to the setting
    lmscope runs: stacks under FSDP or in fp32, else persistent copies (shadows)."""
    if precision not in COMPUTE_BYTES:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(COMPUTE_BYTES)}")
    if weight_copies is None:
        weight_copies = "stacks" if world_size > 1 or precision == "fp32" else "shadows"
    if weight_copies not in WEIGHT_COPIES:
        raise ValueError(f"unknown weight copies {weight_copies!r}: choose one of {', '.join(WEIGHT_COPIES)}")
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return _Fast(config=config, batch=batch_size, seq=seq_len, c=COMPUTE_BYTES[precision],
                 flash=attention == "flash", weight_copies=weight_copies, world_size=world_size)


def predict_fast_memory(config: ModelConfig, *, batch_size: int, seq_len: int, precision: str,
                        attention: str = "flash", checkpoint: str = "none", world_size: int = 1,
                        weight_copies: str | None = None,
                        optimizer_state: str = "device") -> FastMemoryPrediction:
    """Predicted memory per device of a train step of the fast model (FSDP over `world_size` > 1
    ranks, fused AdamW with its moments where `optimizer_state` says), the blocks treated as
    `checkpoint` says."""
    check_optimizer_state(optimizer_state)
    if optimizer_state == "host" and world_size < 2:
        raise ValueError(f"host optimizer state needs FSDP over 2 or more ranks, got world size "
                         f"{world_size}: pass --fsdp 2 or more, or --optimizer-state device")
    s = fast_dims(config, batch_size=batch_size, seq_len=seq_len, precision=precision, attention=attention,
                  world_size=world_size, weight_copies=weight_copies)
    s = dataclasses.replace(s, keeps_grads=optimizer_state == "device")
    treatments = parse_treatments(checkpoint, config.num_layers)
    blocks = treatments.per_block()
    kinds = [kind for kind, _ in blocks]
    moved = [_moved(s, kind, i == 0, i > 0 and kinds[i - 1] == FULL) if offloaded else 0
             for i, (kind, offloaded) in enumerate(blocks)]
    static = _static(s, optimizer_state)
    head_weight = s.c if world_size > 1 else 4  # the LM head's weight (and d(weight)) dtype
    vocab_d = config.vocab_size * config.d_model
    led = Ledger(static)
    led.alloc(s.res)  # the embedding output
    for i, kind in enumerate(kinds):
        led.apply(_forward_segment(s, kind, kinds[i - 1] if i else None, moved[i - 1] if i else 0))
    led.offload(moved[-1])
    _loss_forward(led, s, head_weight, last_full=kinds[-1] == FULL)
    forward_peak, activations, offloaded = led.peak, led.level - static, led.host
    led.start_phase()
    led.alloc(s.act + head_weight * vocab_d)  # the loss backward: d(hidden), d(weight) scaled
    led.free(s.act + head_weight * vocab_d)  # the saved ones released
    if world_size > 1:
        led.free(head_weight * vocab_d)  # into the root's gathered gradient (in `static`)
    led.alloc(s.res + s.act)  # final norm backward: grads of x and pending
    led.free(s.act + s.res + s.rows)  # d(hidden), the norm's residual and 1/rms
    for i in reversed(range(config.num_layers)):
        fetch = moved[i] if blocks[i][1] and not (i + 1 < len(blocks) and blocks[i + 1][1]) else 0
        if i and blocks[i][1] and blocks[i - 1][1]:
            fetch += moved[i - 1]  # prefetched
        led.apply(_backward_segment(s, kinds[i], kinds[i - 1] if i else None, fetch))
    if s.keeps_grads:
        led.alloc(4 * math.ceil(vocab_d / world_size))  # the embedding's gradient
    return FastMemoryPrediction(static=static, forward_peak=forward_peak, backward_peak=led.peak,
                                step_peak=max(forward_peak, led.peak), activations=activations,
                                offloaded=offloaded)


def _static(s: _Fast, optimizer_state: str) -> int:
    """Bytes allocated before the step (see FastMemoryPrediction.static)."""
    config = s.config
    buffers = 2 * config.context_length * (config.head_dim // 2) * 4 + 2 * 8 * s.n  # RoPE, batch
    if s.world_size > 1:
        fsdp = predict_fsdp(config, world_size=s.world_size, batch_size=s.batch, seq_len=s.seq,
                            precision="bf16" if s.c == 2 else "fp32", fast=True,
                            optimizer_state=optimizer_state)
        gathered = max(fsdp.gathered_forward, fsdp.gathered_backward)
        return fsdp.params + fsdp.optimizer_state + fsdp.optimizer_in_flight + gathered + buffers
    params = parameter_counts(config)["total"]
    block_matmuls = config.num_layers * (4 * config.d_model**2 + 3 * config.d_model * config.d_ff)
    shadows = s.c * block_matmuls if s.weight_copies == "shadows" else 0
    return 4 * params + 8 * params + shadows + buffers


def _loss_forward(led: Ledger, s: _Fast, head_weight: int, last_full: bool) -> None:
    """Final norm and the fused LM head + cross-entropy (gradients computed here, kept)."""
    config = s.config
    vocab_d = config.vocab_size * config.d_model
    led.hold("residual", s.res, True)  # s = x + pending
    led.free(s.act + (s.res if last_full else 0))  # pending consumed; x unless a block saved it
    led.hold("norm_rstd", s.rows, True)
    led.alloc(s.act)  # h
    cast = s.c * vocab_d if head_weight != s.c else 0  # the head's weight in the compute dtype
    chunk = min(s.n, max(CHUNK_MIN_TOKENS, CHUNK_BYTES // (config.vocab_size * s.c)))
    led.alloc(cast + 4 * s.n)  # cast, per-token losses
    led.hold("loss", s.act + head_weight * vocab_d, True)  # d(hidden), d(weight)
    led.alloc(s.c * chunk * config.vocab_size)  # one chunk's logits; its matmul accumulates into d(weight)
    led.free(s.c * chunk * config.vocab_size + cast + 4 * s.n + s.act)  # ... and h
