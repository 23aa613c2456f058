"""Model configuration and the named presets of the classic Transformer systems study.

`accounting` and `config` import no device state: they run anywhere, GPU or not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lmscope.inputs.limits import check_size


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the reference Transformer LM (pre-norm, RoPE, SwiGLU, untied head, no biases)."""

    vocab_size: int = 10_000
    """Number of token ids; the embedding and the LM head have this many rows."""
    context_length: int = 1024
    """Longest sequence the model accepts."""
    d_model: int = 768
    """Width of the residual stream."""
    d_ff: int = 3072
    """Inner width of the SwiGLU feed-forward block."""
    num_layers: int = 12
    """Number of Transformer blocks."""
    num_heads: int = 12
    """Number of attention heads; d_model / num_heads is the head dimension."""
    rope_theta: float = 10_000.0
    """Base of the rotary position embedding frequencies."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "d_ff", "num_layers", "num_heads"):
            check_size(name, getattr(self, name))
        if self.d_model % self.num_heads:
            raise ValueError(
                f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}: "
                f"choose num_heads among the divisors of d_model (e.g. {_divisor_hint(self.d_model)})"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"head dimension d_model/num_heads = {self.head_dim} is odd, but RoPE rotates pairs: "
                "choose num_heads so that d_model/num_heads is even"
            )
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")

    @property
    def head_dim(self) -> int:
        """Dimension of one attention head."""
        return self.d_model // self.num_heads

    def replace(self, **changes: object) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


def _divisor_hint(n: int) -> str:
    divisors = [d for d in range(1, min(n, 64) + 1) if n % d == 0 and (n // d) % 2 == 0]
    return ", ".join(str(d) for d in divisors[-4:]) or "1"


PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(d_model=64, d_ff=192, num_layers=2, num_heads=4, context_length=256),
    "small": ModelConfig(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": ModelConfig(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": ModelConfig(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": ModelConfig(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": ModelConfig(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
    "xl-2025": ModelConfig(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
    "10b-2025": ModelConfig(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
    "8b-long": ModelConfig(d_model=4096, d_ff=11008, num_layers=34, num_heads=32, vocab_size=151_936,
                           context_length=32_768),
}
"""Named model sizes; `tiny` runs on a laptop CPU in seconds; small..2.7B are the study's table.

The newer edition of the study renamed and added sizes; they sit beside the old names, which keep
their meaning: `xl-2025` is its xl (the shape of the old 2.7B, not the old xl: 2560/10240/32),
`10b-2025` its 10B (4608/12288/50), both with the study's 10,000-token vocabulary and 128-, resp.
80-dimensional heads chosen here (36 and 32 heads: the edition gives no head count); `8b-long` its
long-context 8B model (4096/11008/34, 32 heads, a 151,936-token vocabulary, context 32,768).
"""


def preset(name: str, **overrides: object) -> ModelConfig:
    """The preset `name` with any fields overridden; unknown names list the known ones."""
    key = {k.lower(): k for k in PRESETS}.get(name.lower())
    if key is None:
        raise ValueError(f"unknown model size {name!r}: choose one of {', '.join(PRESETS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return PRESETS[key].replace(**overrides) if overrides else PRESETS[key]
