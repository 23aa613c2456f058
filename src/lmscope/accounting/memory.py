"""Predicted memory of one step of the reference Transformer LM, per phase, without a GPU.

`predict_memory` replays the step as the sequence of allocations and frees that PyTorch's CUDA
caching allocator sees in eager mode: op by op through TransformerLM's forward (what each op
allocates, what autograd keeps, what dies at its last use), node by node through autograd's
backward (gradients allocated, saved tensors released), then the fused AdamW step. A phase's peak
is the highest running total between its start and its end, which is what
`reset_peak_memory_stats` at the phase start and `max_memory_allocated` at its end measure.

What autograd keeps per block (btd = batch*seq*d_model elements, btf = batch*seq*d_ff,
S = batch*heads*seq^2; a = 4 bytes in fp32, 2 under bf16/fp16 autocast):

* RMSNorm (x2): its fp32 input (the residual stream: embedding output, x + attn), the fp32
  normalized x, the fp32 1/rms per row (pow, mul and rsqrt save them; the gain's mul saves normed).
* Projections: the input of every linear. In fp32 the q/k/v projections share one fp32 input; under
  autocast each casts the fp32 norm output to bf16 itself (3 copies, 2 for w1/w3, 1 for the head).
* RoPE keeps nothing of q/k (cos/sin need no grad): only, under autocast, the bf16 casts of the
  cos/sin tables it multiplies by.
* Naive attention: rotated q and k (scores matmul), the seq x seq bool mask (masked_fill), the
  softmax output in fp32 (autocast runs softmax in fp32), under autocast also its bf16 cast (P V
  matmul), and a contiguous copy of v (matmul cannot view the transposed heads as a batch).
* SDPA and lmscope's fused kernels: q, k, v, the output and the log-sum-exp (fp32). torch's
  memory-efficient kernel (fp32) writes its output as (batch, seq, heads, dim), so the output
  projection views it; the flash kernel (bf16/fp16) writes (batch, heads, seq, dim) and the
  projection needs a copy; the efficient kernel pads the log-sum-exp to 32 rows.
* SwiGLU: w1 x (silu input), silu(w1 x), w3 x (the product's factors) and their product (w2 input).
* Loss: fp32 log-softmax of the logits (cross-entropy); the logits and their fp32 copy are freed
  once the loss exists.

Not modelled: the caching allocator's rounding (512 bytes, or a whole block when the remainder of a
large block is under 1 MiB), cuBLAS/cuBLASLt workspaces (allocated once, a few to 32 MiB), kernels'
internal scratch (flash split-KV accumulators, embedding backward's index sort; the flash backward's
fp32 dQ accumulator, one (tokens, d_model) fp32 tensor during an attention backward, which comes
after the same block's SwiGLU backward has reached a higher level: it sets no peak while d_ff is
not far below d_model), and torch.compile (which decides what to save by itself): predictions are
for eager mode.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from lmscope.accounting.flops import MODES, parameter_counts
from lmscope.accounting.ledger import Ledger, Segment, record
from lmscope.accounting.treatment_cost import BlockBytes
from lmscope.accounting.treatments import FULL, NONE, SELECTIVE, BlockTreatments, parse_treatments
from lmscope.config import ModelConfig

GIB = 2**30

ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
"""Bytes of the activation dtype per precision (bf16/fp16 are autocast over fp32 weights)."""

ATTENTIONS = ("naive", "sdpa", "sdpa-cudnn", "flash", "flash-torch")
"""Attention backends the model knows (those of lmscope.model.attention)."""

LSE_ALIGN = 32
"""Rows torch's memory-efficient attention pads its log-sum-exp to."""


def checkpointed_blocks(policy: str, num_layers: int) -> tuple[int, ...]:
    """Indices of the blocks a policy checkpoints fully (recomputes whole in the backward).

    none; block (all); every:K (0, K, 2K, ...); blocks:LIST (explicit indices and ranges, e.g.
    blocks:0-3,7); parts joined with + may add selective[:LIST] and offload[:LIST] blocks
    (`lmscope.accounting.treatments`). `plan:BUDGET` is resolved to a policy by
    `lmscope.accounting.checkpoint_plan`.
    """
    return parse_treatments(policy, num_layers).full


@dataclass(frozen=True)
class MemoryPrediction:
    """Predicted allocated bytes: the peak of each phase of a step, and what they are made of.

    A phase the mode does not run (backward in forward mode, optimizer without train-step) is None.
    The peaks are not sums of `components`: they come from replaying the allocations in order, which
    adds short-lived buffers (attention scores around the softmax, gradients in flight).
    """

    after_init: int
    """Parameters, RoPE tables and the batch, right after the model is built."""
    forward_peak: int
    """Peak of the forward (and loss) from the start of a step, gradients freed (set_to_none)."""
    backward_peak: int | None
    """Peak of loss.backward()."""
    optimizer_peak: int | None
    """Peak of optimizer.step() (fused AdamW)."""
    step_peak: int
    """Peak over the whole step."""
    components: dict[str, int] = field(default_factory=dict)
    """Bytes by kind: parameters, buffers, batch, gradients, optimizer_state, autocast_copies,
    activations (kept for backward on the device at the end of forward), logits (loss buffers),
    recompute, offloaded (kept in host memory)."""
    residual_activation_bytes: int = 0
    """One batch x seq x d_model tensor in the activation dtype."""

    def as_record(self) -> dict[str, float | None]:
        """Flat dict in GiB: predicted_<phase>_gib, predicted_<component>_gib."""
        phases = {
            "after_init": self.after_init,
            "forward_peak": self.forward_peak,
            "backward_peak": self.backward_peak,
            "optimizer_peak": self.optimizer_peak,
            "step_peak": self.step_peak,
        }
        record: dict[str, float | None] = {
            f"predicted_{name}_gib": None if value is None else value / GIB
            for name, value in phases.items()
        }
        record.update({f"predicted_{name}_gib": value / GIB for name, value in self.components.items()})
        record["predicted_residual_activation_gib"] = self.residual_activation_bytes / GIB
        return record


@dataclass(frozen=True)
class _Dims:
    """Byte sizes of the tensors of one step, for one config, batch, precision and attention."""

    config: ModelConfig
    batch: int
    seq: int
    precision: str
    attention: str
    kernel: str
    """How attention runs: naive, efficient (SDPA fp32) or flash (SDPA bf16/fp16, lmscope's)."""

    @property
    def autocast(self) -> bool:
        return self.precision != "fp32"

    @property
    def elt(self) -> int:
        return ELEMENT_BYTES[self.precision]

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def res(self) -> int:
        """An fp32 (tokens, d_model) tensor: the residual stream stays fp32 (fp32 embedding)."""
        return 4 * self.tokens * self.config.d_model

    @property
    def act(self) -> int:
        """A (tokens, d_model) tensor in the activation dtype."""
        return self.elt * self.tokens * self.config.d_model

    @property
    def cast(self) -> int:
        """Autocast's low-precision copy of an fp32 (tokens, d_model) input (0 in fp32)."""
        return 2 * self.tokens * self.config.d_model if self.autocast else 0

    @property
    def rows(self) -> int:
        """One fp32 value per token (RMSNorm's 1/rms)."""
        return 4 * self.tokens

    @property
    def ffn(self) -> int:
        """A (tokens, d_ff) tensor in the activation dtype."""
        return self.elt * self.tokens * self.config.d_ff

    @property
    def score_elems(self) -> int:
        return self.batch * self.config.num_heads * self.seq * self.seq

    @property
    def scores(self) -> int:
        """Attention scores in the activation dtype."""
        return self.elt * self.score_elems

    @property
    def probs32(self) -> int:
        """Softmax output: fp32 in fp32 and under autocast (softmax is an fp32 op there)."""
        return 4 * self.score_elems

    @property
    def probs16(self) -> int:
        """Autocast's bf16 cast of the softmax output for the P V matmul (0 in fp32)."""
        return 2 * self.score_elems if self.autocast else 0

    @property
    def mask(self) -> int:
        return self.seq * self.seq

    @property
    def rope_tables(self) -> int:
        """cos and sin cast to the activation dtype by one RoPE call (views of fp32 buffers in fp32)."""
        return 2 * self.seq * (self.config.head_dim // 2) * 2 if self.autocast else 0

    @property
    def lse(self) -> int:
        rows = math.ceil(self.seq / LSE_ALIGN) * LSE_ALIGN if self.kernel == "efficient" else self.seq
        return 4 * self.batch * self.config.num_heads * rows

    @property
    def out_copy(self) -> bool:
        """Whether the output projection needs a copy of the attention output (not a view)."""
        return self.kernel != "efficient"

    @property
    def logits(self) -> int:
        return self.elt * self.tokens * self.config.vocab_size

    @property
    def logits32(self) -> int:
        return 4 * self.tokens * self.config.vocab_size

    def weight_copy(self, elements: int) -> int:
        """Autocast's cached bf16 copy of an fp32 weight (0 in fp32)."""
        return 2 * elements if self.autocast else 0


# ---------------------------------------------------------------- forward, op by op


def _linear_forward(led: Ledger, s: _Dims, kind: str, weight: int, out: int, save: bool,
                    fp32_input: bool) -> None:
    """y = x W^T: under autocast an fp32 input is cast (kept), the weight cast (cached); y is left live."""
    cast = s.cast if fp32_input else 0
    led.hold(kind, cast, save)
    led.weight_copy(s.weight_copy(weight), save)
    led.alloc(out)
    led.drop(cast, save)


def _rmsnorm_forward(led: Ledger, s: _Dims, save: bool) -> None:
    """RMSNorm of a live fp32 x (kept by the caller): leaves h = normed * gain (fp32) live."""
    led.alloc(s.res)  # x.pow(2)
    led.alloc(s.rows)  # .mean(-1)
    led.free(s.res)
    led.alloc(s.rows)  # + eps
    led.free(s.rows)
    led.hold("norm_rstd", s.rows, save)  # rsqrt
    led.free(s.rows)
    led.hold("norm_normed", s.res, save)  # x * rstd
    led.drop(s.rows, save)
    led.alloc(s.res)  # normed * weight (.to(x.dtype) is a no-op: x is fp32)
    led.drop(s.res, save)


def _rope_forward(led: Ledger, s: _Dims, save: bool) -> None:
    """RoPE of a live projection: leaves the rotated tensor live and frees the projection."""
    half = s.act // 2
    led.hold("rope_tables", s.rope_tables, save)  # cos/sin .to(x.dtype)
    led.alloc(half)  # even * cos
    led.alloc(half)  # odd * sin
    led.alloc(half)  # difference
    led.free(2 * half)
    led.alloc(half)  # even * sin
    led.alloc(half)  # odd * cos
    led.alloc(half)  # sum
    led.free(2 * half)
    led.alloc(s.act)  # torch.stack(...).flatten(-2)
    led.free(2 * half)
    led.free(s.act)  # the projection (not saved: cos/sin need no grad)
    led.drop(s.rope_tables, save)


def _naive_attention_forward(led: Ledger, s: _Dims, save: bool) -> None:
    """Scores, mask, softmax, P V on live q, k, v: leaves the (B*H, T, D) output live."""
    led.alloc(s.scores)  # q @ k^T
    led.alloc(s.scores)  # / sqrt(d)
    led.free(s.scores)
    led.alloc(s.mask)  # torch.ones(seq, seq, bool)
    led.hold("attn_mask", s.mask, save)  # triu
    led.free(s.mask)
    led.alloc(s.scores)  # masked_fill (the local `scores`, alive until the function returns)
    led.free(s.scores)
    if s.autocast:
        led.alloc(s.probs32)  # softmax(dtype=float32) converts its bf16 input first
    led.hold("attn_probs", s.probs32, save)
    if s.autocast:
        led.free(s.probs32)
    led.hold("attn_probs", s.probs16, save)  # autocast's bf16 cast of probs for the matmul
    led.hold("attn_v_copy", s.act, save)  # matmul's contiguous copy of v
    led.alloc(s.act)  # probs @ v
    led.drop(s.act, save)
    led.drop(s.probs16, save)
    led.free(s.scores)  # masked scores
    led.drop(s.probs32, save)
    led.drop(s.mask, save)


def _attention_forward(led: Ledger, s: _Dims, save: bool) -> None:
    """CausalSelfAttention on the live fp32 norm output h: leaves the projection o live, frees h."""
    d = s.config.d_model
    for _ in ("q", "k"):
        _linear_forward(led, s, "qkv_input", d * d, s.act, save, fp32_input=True)
        _rope_forward(led, s, save)
    _linear_forward(led, s, "qkv_input", d * d, s.act, save, fp32_input=True)  # v
    if save and not s.autocast:
        led.adopt("qkv_input", s.res)  # the three projections save the shared fp32 h
    if save:
        led.adopt("attn_q_k", 2 * s.act)
    if s.kernel == "naive":
        _naive_attention_forward(led, s, save)
        led.free(s.act)  # v projection: the copy is what is kept
    else:
        led.hold("attn_output", s.act, save)
        led.hold("attn_lse", s.lse, save)
        led.drop(s.lse, save)
        if save:
            led.adopt("attn_v", s.act)
    copy = s.act if s.out_copy else 0
    led.hold("out_proj_input", copy, save)  # out.transpose(1, 2).reshape(...)
    _linear_forward(led, s, "out_proj_input", d * d, s.act, save, fp32_input=False)
    # attn.forward returns: its locals q, k, v, out and the argument h go
    led.drop(copy, save)
    if s.kernel == "naive":
        led.free(s.act)  # bmm output
        led.drop(2 * s.act, save)  # q, k
    else:
        led.drop(4 * s.act, save)  # q, k, v, output
    led.drop(s.res, save and not s.autocast)


def _ffn_forward(led: Ledger, s: _Dims, save: bool) -> None:
    """SwiGLU on the live fp32 norm output h: leaves w2(silu(w1 h) * w3 h) live, frees h."""
    d, f = s.config.d_model, s.config.d_ff
    _linear_forward(led, s, "ffn_input", d * f, s.ffn, save, fp32_input=True)  # w1
    if save:
        led.adopt("ffn_hidden", s.ffn)
    led.hold("ffn_hidden", s.ffn, save)  # silu
    led.drop(s.ffn, save)  # w1 output
    _linear_forward(led, s, "ffn_input", d * f, s.ffn, save, fp32_input=True)  # w3
    if save:
        led.adopt("ffn_hidden", s.ffn)
    led.hold("ffn_hidden", s.ffn, save)  # product
    led.drop(2 * s.ffn, save)  # silu output, w3 output
    _linear_forward(led, s, "ffn_input", f * d, s.act, save, fp32_input=False)  # w2
    led.drop(s.ffn, save)  # product
    if save and not s.autocast:
        led.adopt("ffn_input", s.res)  # w1 and w3 save the shared fp32 h
    led.drop(s.res, save and not s.autocast)


def _block_forward(led: Ledger, s: _Dims, save: bool, input_kept: bool) -> None:
    """One pre-norm block on the live residual x; leaves the block output live.

    save: grad mode and not checkpointed (autograd keeps what the ops save). input_kept: x stays
    alive after the block (saved by its RMSNorm, or held by the checkpoint); else it dies at its
    last use (no-grad forward).
    """
    if save:
        led.adopt("residual", s.res)
    elif input_kept:
        led.adopt("checkpoint_inputs", s.res)
    _rmsnorm_forward(led, s, save)
    _attention_forward(led, s, save)
    led.alloc(s.res)  # x1 = x + attn
    led.free(s.act)
    if save:
        led.adopt("residual", s.res)
    _rmsnorm_forward(led, s, save)
    _ffn_forward(led, s, save)
    led.alloc(s.res)  # x2 = x1 + ffn
    led.free(s.act)
    led.drop(s.res, save)  # x1
    if not input_kept:
        led.free(s.res)  # x: the caller's loop variable holds it until the block returns


Block = tuple[str, bool]
"""A block's treatment: its kind (none, full, selective) and whether it is offloaded."""


def _model_forward(led: Ledger, s: _Dims, grad: bool, treatments: BlockTreatments) -> None:
    """Embedding, blocks, final norm, LM head, autocast exit: leaves the logits live."""
    c = s.config
    led.alloc(s.res)  # token embedding (fp32: embedding is not an autocast op)
    if not grad:
        for _ in range(c.num_layers):
            led.apply(_inference_segment(s))
    else:
        blocks = treatments.per_block()
        for index, block in enumerate(blocks):
            led.apply(_forward_segment(s, block, blocks[index - 1] if index else None))
        if blocks and blocks[-1][1]:
            led.offload(_offloaded_bytes(s, blocks[-1][0]))  # the last block's copies finish
    if grad:
        led.adopt("residual", s.res)
    _rmsnorm_forward(led, s, grad)
    _linear_forward(led, s, "lm_head_input", c.d_model * c.vocab_size, s.logits, grad, fp32_input=True)
    if grad and not s.autocast:
        led.adopt("lm_head_input", s.res)
    led.drop(s.res, grad and not s.autocast)
    led.drop(s.res, grad)  # final norm input: the forward's local x holds it until it returns
    led.exit_autocast()


def _loss_forward(led: Ledger, s: _Dims) -> None:
    """cross_entropy(logits.float()): keeps the fp32 log-softmax, frees the logits."""
    if s.autocast:
        led.alloc(s.logits32)  # .float()
    led.hold("log_softmax", s.logits32, True)
    if s.autocast:
        led.free(s.logits32)
    led.free(s.logits)


# ---------------------------------------------------------------- backward, node by node


def _linear_backward(led: Ledger, s: _Dims, weight: int, grad_input: int, saved_input: int) -> None:
    """MmBackward: grads of the input and weight, release of the saved input and weight copy.

    grad_input: bytes of the input's grad in the compute dtype; under autocast a grad to an fp32
    input (cast inside autocast) is cast back to fp32. The weight's grad ends as its fp32 .grad.
    """
    led.alloc(grad_input)
    led.alloc(s.elt * weight)
    led.free(saved_input + s.weight_copy(weight))
    if s.autocast:
        led.alloc(4 * weight)  # ToCopyBackward to fp32, then AccumulateGrad steals it
        led.free(2 * weight)


def _grad_to_fp32(led: Ledger, s: _Dims, nbytes: int, fp32_bytes: int) -> None:
    """Under autocast, the grad of a cast fp32 input goes back to fp32 (ToCopyBackward)."""
    if s.autocast:
        led.alloc(fp32_bytes)
        led.free(nbytes)


def _rmsnorm_backward(led: Ledger, s: _Dims) -> None:
    """RMSNorm backward from a live grad of h: accumulates into the residual grad, frees x, normed, rstd."""
    d = s.config.d_model
    led.alloc(s.res)  # grad * normed, for the gain
    led.alloc(4 * d)  # the gain's grad (kept)
    led.free(s.res)
    led.alloc(s.res)  # grad * gain
    led.free(s.res)  # release normed
    led.free(s.res)  # grad of h consumed
    led.alloc(s.res)  # grad_normed * rstd
    led.alloc(s.res)  # grad_normed * x, summed to rows
    led.alloc(s.rows)
    led.free(s.res)
    led.free(s.res)  # grad_normed consumed
    led.alloc(s.res)  # mean backward: expand / d
    led.alloc(s.res)  # pow backward: x.pow(1)
    led.alloc(s.res)  # 2 * x
    led.free(s.res)
    led.alloc(s.res)  # grad * 2x
    led.free(3 * s.res)
    led.free(s.rows)
    led.free(s.rows)  # release rstd
    led.free(s.res)  # accumulated into the residual grad in place
    led.free(s.res)  # release x


def _rope_backward(led: Ledger, s: _Dims) -> None:
    """RoPE backward from a live grad of the rotated tensor: leaves the projection's grad live."""
    half = s.act // 2
    led.alloc(half)  # -grad for the difference
    led.alloc(4 * half)  # the four products' grads
    led.free(2 * half)  # pairs accumulated in place
    led.free(half)
    led.alloc(2 * s.act)  # slice backward of the even and odd halves
    led.free(2 * half)
    led.free(s.act)  # accumulated in place
    led.free(s.act)  # grad of the rotated tensor
    led.free(s.rope_tables)
    led.alloc(s.act)  # (B, H, T, D) -> (B, T, d): the heads' transpose needs a copy
    led.free(s.act)


def _naive_attention_backward(led: Ledger, s: _Dims) -> None:
    """P V, softmax, mask, scale and Q K^T backward from a live grad of the output; leaves dq, dk, dv."""
    led.alloc(s.act)  # grad of the output as (B*H, T, D): copy of the transposed view
    led.free(s.act)
    led.alloc(s.scores)  # grad of probs
    led.alloc(s.act)  # grad of the v copy
    led.free(s.act)  # output grad consumed
    led.free(s.act + s.probs16)  # release v copy (and the bf16 probs)
    if s.autocast:
        led.alloc(s.probs32)
        led.free(s.scores)
    led.alloc(s.probs32)  # softmax backward
    led.free(s.probs32)  # grad of probs consumed
    led.free(s.probs32)  # release probs
    if s.autocast:
        led.alloc(s.scores)
        led.free(s.probs32)
    led.alloc(s.scores)  # masked_fill backward
    led.free(s.scores + s.mask)
    led.alloc(s.scores)  # / sqrt(d) backward
    led.free(s.scores)
    led.alloc(2 * s.act)  # grads of q and k
    led.free(s.scores)
    led.free(2 * s.act)  # release q, k


def _fused_attention_backward(led: Ledger, s: _Dims) -> None:
    """SDPA / fused kernel backward from a live grad of the output; leaves dq, dk, dv."""
    led.alloc(3 * s.act + s.lse)  # dq, dk, dv, softmax row sums
    led.free(s.lse)
    led.free(s.act)  # output grad consumed
    led.free(4 * s.act + s.lse)  # release q, k, v, output, lse


def _attention_backward(led: Ledger, s: _Dims) -> None:
    """Attention branch backward from the live residual grad: leaves the grad of h (fp32) live."""
    d = s.config.d_model
    led.alloc(s.cast)  # the residual grad cast to the projection's dtype
    copy = s.act if s.out_copy else 0
    _linear_backward(led, s, d * d, grad_input=s.act, saved_input=copy)  # output_proj
    led.free(s.cast)
    if s.kernel == "naive":
        _naive_attention_backward(led, s)
    else:
        _fused_attention_backward(led, s)
    if s.kernel == "naive":
        led.alloc(s.act)  # dv back to (B, T, d): the heads' transpose needs a copy
        led.free(s.act)  # (fused kernels write dv in the (B, T, H, D) layout of v)
    _linear_backward(led, s, d * d, grad_input=s.act, saved_input=s.cast)  # v_proj
    _grad_to_fp32(led, s, s.act, s.res)
    led.free(s.act)  # dv consumed; the grad of h is live
    for _ in ("k", "q"):
        _rope_backward(led, s)
        _linear_backward(led, s, d * d, grad_input=s.act, saved_input=s.cast)
        _grad_to_fp32(led, s, s.act, s.res)
        led.free(s.act)  # grad of the projection output consumed
        led.free(s.res)  # accumulated into the grad of h in place
    if not s.autocast:
        led.free(s.res)  # release the shared fp32 h


def _ffn_backward(led: Ledger, s: _Dims) -> None:
    """SwiGLU branch backward from the live residual grad: leaves the grad of h (fp32) live."""
    d, f = s.config.d_model, s.config.d_ff
    led.alloc(s.cast)  # the residual grad cast to w2's dtype
    _linear_backward(led, s, f * d, grad_input=s.ffn, saved_input=s.ffn)  # w2; releases the product
    led.free(s.cast)
    led.alloc(2 * s.ffn)  # grads of silu(w1 h) and w3 h
    led.free(s.ffn)  # grad of the product consumed
    led.free(2 * s.ffn)  # release silu(w1 h), w3 h
    _linear_backward(led, s, d * f, grad_input=s.act, saved_input=s.cast)  # w3
    _grad_to_fp32(led, s, s.act, s.res)
    led.free(s.ffn)
    led.alloc(s.ffn)  # silu backward
    led.free(s.ffn)  # grad of silu's output consumed
    led.free(s.ffn)  # release w1 h
    _linear_backward(led, s, d * f, grad_input=s.act, saved_input=s.cast)  # w1
    _grad_to_fp32(led, s, s.act, s.res)
    led.free(s.ffn)
    led.free(s.res)  # the two grads of h summed in place
    if not s.autocast:
        led.free(s.res)  # release the shared fp32 h


def _block_backward(led: Ledger, s: _Dims) -> None:
    """One block's backward from the live grad of its output; leaves the grad of its input live."""
    _ffn_backward(led, s)
    _rmsnorm_backward(led, s)
    _attention_backward(led, s)
    _rmsnorm_backward(led, s)


def _model_backward(led: Ledger, s: _Dims, treatments: BlockTreatments) -> None:
    """Loss, LM head, final norm, blocks last to first (recomputing checkpointed ones), embedding."""
    c = s.config
    led.alloc(s.logits32)  # NllLossBackward
    led.alloc(s.logits32)  # LogSoftmaxBackward
    led.free(2 * s.logits32)  # nll grad consumed, log-softmax released
    if s.autocast:
        led.alloc(s.logits)  # back to the bf16 logits
        led.free(s.logits32)
    lm_input = s.cast if s.autocast else s.res
    _linear_backward(led, s, c.d_model * c.vocab_size, grad_input=s.act, saved_input=lm_input)
    _grad_to_fp32(led, s, s.act, s.res)
    led.free(s.logits)  # grad of the logits consumed
    _rmsnorm_backward(led, s)
    led.alloc(s.res)  # the final norm's input grad becomes the residual grad
    blocks = treatments.per_block()
    for index in reversed(range(c.num_layers)):
        before = blocks[index - 1] if index else None
        after = blocks[index + 1][1] if index + 1 < c.num_layers else False
        led.apply(_backward_segment(s, blocks[index], before, after))
    led.alloc(4 * c.vocab_size * c.d_model)  # embedding grad
    led.free(s.res)  # residual grad consumed


# ---------------------------------------------------------------- blocks by treatment, as segments


@functools.lru_cache(maxsize=512)
def _inference_segment(s: _Dims) -> Segment:
    """A block's no-grad forward: its input dies at its last use."""
    return record(lambda led: _block_forward(led, s, save=False, input_kept=False))


@functools.lru_cache(maxsize=512)
def _forward_segment(s: _Dims, block: Block, before: Block | None) -> Segment:
    """A block's forward under its treatment; the previous block's copies to host end with it.

    full: torch.utils.checkpoint keeps the block's input, the ops save nothing. selective (torch's
    selective checkpointing on an eager block): the same, and the outputs of the matmuls and of
    attention are cached until the backward (counted from the block's end: inside the block they
    live from their op on, so its forward's own peak may be higher by up to that much).
    """
    kind, _ = block

    def run(led: Ledger) -> None:
        _block_forward(led, s, save=kind == NONE, input_kept=True)
        if kind == SELECTIVE:
            led.hold("selective_cache", _selective_cache(s), True)
        if before is not None and before[1]:
            led.offload(_offloaded_bytes(s, before[0]))

    return record(run)


@functools.lru_cache(maxsize=512)
def _backward_segment(s: _Dims, block: Block, before: Block | None, after_offloaded: bool) -> Segment:
    """A block's backward: its offloaded tensors back (unless the next block's backward prefetched
    them), the previous block's prefetched when both are offloaded, the recompute, the backward."""
    kind, offloaded = block

    def run(led: Ledger) -> None:
        if offloaded and not after_offloaded:
            led.fetch(_offloaded_bytes(s, kind))
        if offloaded and before is not None and before[1]:
            led.fetch(_offloaded_bytes(s, before[0]))
        if kind != NONE:
            if kind == SELECTIVE:
                led.free(_selective_cache(s))  # handed to the recompute as its matmuls' outputs
            _block_forward(led, s, save=True, input_kept=True)  # recompute, keeping what it saves
            led.free(s.res)  # early stop: the block output is not recomputed
        _block_backward(led, s)

    return record(run)


STAY_ON_DEVICE = ("autocast_copies", "rope_tables", "attn_mask")
"""Saved kinds offloading leaves on the device: weight copies, and tensors without the batch's
tokens in their leading dims (RoPE's cos/sin casts, the causal mask)."""


def _offloaded_bytes(s: _Dims, kind: str) -> int:
    """Bytes a block of `kind` keeps for its backward that offloading moves to the host."""
    return _forward_segment(s, (kind, False), None).kept_bytes(leave_out=STAY_ON_DEVICE)


def eager_block_bytes(config: ModelConfig, *, batch_size: int, seq_len: int, precision: str,
                      attention: str) -> BlockBytes:
    """What offloading moves per eager block by kind, and the memory traffic of torch's selective
    recompute of one block: every op but the matmuls and attention runs again, each reading about
    what it writes (twice the bytes the block's forward allocates beyond the cached outputs)."""
    s = _dims(config, batch_size, seq_len, precision, attention)
    led = Ledger(0)
    _block_forward(led, s, save=False, input_kept=True)
    return BlockBytes(moved={kind: _offloaded_bytes(s, kind) for kind in (NONE, FULL, SELECTIVE)},
                      rebuild_traffic=2 * (led.allocated - _selective_cache(s)))


def _selective_cache(s: _Dims) -> int:
    """What torch's selective checkpointing caches of an eager block: the outputs of the q, k, v,
    output, w1, w3 and w2 matmuls and of attention (SDPA's output and log-sum-exp; naive: both
    bmm outputs, the scores and P V)."""
    attention = s.scores + s.act if s.kernel == "naive" else s.act + s.lse
    return 5 * s.act + 2 * s.ffn + attention


# ---------------------------------------------------------------- public API


def _dims(config: ModelConfig, batch_size: int, seq_len: int, precision: str, attention: str,
          kernel: str | None = None) -> _Dims:
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if seq_len > config.context_length:
        raise ValueError(
            f"seq_len {seq_len} exceeds the model's context_length {config.context_length}: "
            "raise the context_length or shorten the sequence"
        )
    if precision not in ELEMENT_BYTES:
        raise ValueError(f"unknown precision {precision!r}: choose one of {', '.join(ELEMENT_BYTES)}")
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}: choose one of {', '.join(ATTENTIONS)}")
    if kernel is None:
        kernel = attention_kernel(attention, precision)
    return _Dims(config=config, batch=batch_size, seq=seq_len, precision=precision,
                 attention=attention, kernel=kernel)


def attention_kernel(attention: str, precision: str) -> str:
    """What runs for a backend on a CUDA GPU: naive, efficient (SDPA in fp32) or flash."""
    if attention == "naive":
        return "naive"
    if attention == "sdpa" and precision == "fp32":
        return "efficient"
    return "flash"


def saved_activations(config: ModelConfig, *, batch_size: int, seq_len: int, precision: str,
                      attention: str = "naive", kernel: str | None = None) -> dict[str, int]:
    """Bytes autograd keeps at the end of forward (no checkpointing), by kind, plus 'total'.

    Weight copies are not activations (see predict_memory's autocast_copies). `kernel` overrides
    the attention kernel (naive, efficient, flash): CPU SDPA, for one, lays its output out like flash.
    """
    s = _dims(config, batch_size, seq_len, precision, attention, kernel)
    led = Ledger(0)
    _model_forward(led, s, grad=True, treatments=BlockTreatments(config.num_layers))
    _loss_forward(led, s)
    kept = {k: v for k, v in led.kept.items() if k != "autocast_copies"}
    kept["total"] = sum(kept.values())
    return kept


def saved_activations_by_group(config: ModelConfig, *, batch_size: int, seq_len: int, precision: str,
                               attention: str = "naive", kernel: str | None = None) -> dict[str, int]:
    """What autograd keeps, by where it is first saved: per block, ln_final, lm_head and the loss.

    'block' is one Transformer block, its input residual included (its first RMSNorm saves it);
    the values add up to `saved_activations(...)["total"]` as block * num_layers + the rest.
    'checkpointed_block' is what a checkpointed block keeps: its fp32 input. Weight copies are left
    out, as in `saved_activations`.
    """
    s = _dims(config, batch_size, seq_len, precision, attention, kernel)
    led = Ledger(0)
    _block_forward(led, s, save=True, input_kept=True)
    block = sum(v for k, v in led.kept.items() if k != "autocast_copies")
    return {
        "block": block,
        "checkpointed_block": s.res,
        "ln_final": s.res + s.rows + s.res,  # its input, 1/rms, the normalized x
        "lm_head": s.cast if s.autocast else s.res,  # the linear's input
        "loss": s.logits32,  # cross-entropy's fp32 log-softmax
    }


def saved_by_treatment(config: ModelConfig, *, batch_size: int, seq_len: int, precision: str,
                       attention: str = "naive", kernel: str | None = None) -> dict[str, int]:
    """Bytes one block keeps on the device for its backward under each treatment: none, full,
    selective, and each of them offloaded (`none+offload`, ...: what offloading leaves, RoPE's
    casts and the mask). Its input counts, weight copies do not (as in saved_activations_by_group).
    """
    s = _dims(config, batch_size, seq_len, precision, attention, kernel)
    kept = {}
    for kind in (NONE, FULL, SELECTIVE):
        segment = _forward_segment(s, (kind, False), None)
        kept[kind] = segment.kept_bytes(leave_out=("autocast_copies",))
        kept[f"{kind}+offload"] = kept[kind] - _offloaded_bytes(s, kind)
    return kept


def predict_memory(
    config: ModelConfig,
    *,
    batch_size: int,
    seq_len: int,
    mode: str,
    precision: str,
    attention: str = "naive",
    checkpoint: str = "none",
) -> MemoryPrediction:
    """Predicted allocated bytes of each phase of one step (steady state: after warm-up).

    mode: forward (no_grad), forward-backward, train-step (fused AdamW). precision: fp32, or
    bf16/fp16 autocast over fp32 weights. checkpoint: a policy of `lmscope.accounting.treatments`
    (none, block, every:K, blocks:LIST, selective[:LIST], offload[:LIST], joined with +): full
    checkpointing is torch.utils.checkpoint without reentrancy; selective is torch's selective
    checkpointing (the eager blocks' outputs of matmuls and attention cached); offloaded blocks
    free their saved activations once the next block's forward ends and get them back for their
    backward (prefetched during the next block's backward when that one is offloaded too).
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    s = _dims(config, batch_size, seq_len, precision, attention)
    treatments = parse_treatments(checkpoint, config.num_layers)
    params = parameter_counts(config)["total"] * 4
    buffers = 2 * config.context_length * (config.head_dim // 2) * 4  # RoPE cos/sin
    batch = 2 * batch_size * seq_len * 8  # int64 inputs and targets
    after_init = params + buffers + batch
    tensors = 9 * config.num_layers + 3
    optimizer = 2 * params + 4 * tensors if mode == "train-step" else 0
    components = {"parameters": params, "buffers": buffers, "batch": batch}

    base = after_init + optimizer
    led = Ledger(base)
    grad = mode != "forward"
    _model_forward(led, s, grad=grad, treatments=treatments)
    components.update(
        gradients=params if grad else 0,
        optimizer_state=optimizer,
        autocast_copies=s.weight_copy(_matmul_elements(config)),
        activations=sum(v for k, v in led.kept.items() if k != "autocast_copies"),
        logits=s.logits + (s.logits32 if grad and s.autocast else 0) + (s.logits32 if grad else 0),
    )
    if treatments.full or treatments.selective:
        components["recompute"] = _block_saved(s)
    if treatments.offload:
        components["offloaded"] = led.host
    if not grad:
        led.free(s.logits)  # the step drops the logits
        return MemoryPrediction(
            after_init=after_init, forward_peak=led.peak, backward_peak=None, optimizer_peak=None,
            step_peak=led.peak, components=components, residual_activation_bytes=s.act,
        )
    _loss_forward(led, s)
    forward_peak = led.peak
    led.start_phase()
    _model_backward(led, s, treatments)
    backward_peak = led.peak
    optimizer_peak = None
    if mode == "train-step":
        led.start_phase()  # fused AdamW updates parameters and state in place: no temporaries
        optimizer_peak = led.peak
    phases = [p for p in (forward_peak, backward_peak, optimizer_peak) if p is not None]
    return MemoryPrediction(
        after_init=after_init, forward_peak=forward_peak, backward_peak=backward_peak,
        optimizer_peak=optimizer_peak, step_peak=max(phases), components=components,
        residual_activation_bytes=s.act,
    )


def _block_saved(s: _Dims) -> int:
    """Bytes one block keeps for backward: what a checkpointed block brings back when recomputed."""
    led = Ledger(0)
    _block_forward(led, s, save=True, input_kept=True)
    return sum(v for k, v in led.kept.items() if k not in ("autocast_copies", "residual"))


def _matmul_elements(config: ModelConfig) -> int:
    """Weights autocast casts: every linear (attention, SwiGLU, LM head); not embedding or norm gains."""
    counts = parameter_counts(config)
    return counts["attention"] + counts["ffn"] + counts["lm_head"]
