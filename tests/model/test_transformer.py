"""The reference Transformer LM: shapes, causality, RoPE, attention backends agree."""

import pytest
import torch

from lmscope.config import ModelConfig
from lmscope.model.attention import attention_backends, get_attention, naive_attention
from lmscope.model.rope import RotaryEmbedding
from lmscope.model.transformer import TransformerLM

CONFIG = ModelConfig(vocab_size=97, context_length=40, d_model=48, d_ff=80, num_layers=2, num_heads=3)


def test_logits_shape_and_dtype():
    model = TransformerLM(CONFIG)
    tokens = torch.randint(0, CONFIG.vocab_size, (3, 29))
    logits = model(tokens)
    assert logits.shape == (3, 29, CONFIG.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_output_at_t_ignores_tokens_after_t(attention):
    torch.manual_seed(0)
    model = TransformerLM(CONFIG, attention=attention).double()
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 31))
    cut = int(torch.randint(1, 30, ()).item())
    changed = tokens.clone()
    changed[:, cut:] = torch.randint(0, CONFIG.vocab_size, changed[:, cut:].shape)
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :cut], after[:, :cut])
    assert not torch.allclose(before[:, cut:], after[:, cut:])


def test_sequence_longer_than_context_is_refused():
    model = TransformerLM(CONFIG)
    with pytest.raises(ValueError, match="exceeds the model's context_length 40"):
        model(torch.zeros(1, 41, dtype=torch.long))


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(head_dim=16, max_seq_len=64).double()
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)

    def score(m: int, n: int) -> torch.Tensor:
        qm = rope(q.expand(1, 16), positions=torch.tensor([m]))
        kn = rope(k.expand(1, 16), positions=torch.tensor([n]))
        return (qm * kn).sum()

    # The tables are fp32 (angles up to 40 rad, rounded to 2.4e-6): the invariance holds to that.
    close = dict(rtol=0.0, atol=1e-5 * float(q.norm() * k.norm()))
    torch.testing.assert_close(score(5, 2), score(40, 37), **close)
    torch.testing.assert_close(score(9, 9), (q * k).sum(), **close)
    assert not torch.allclose(score(5, 2), score(5, 3))


def test_rope_preserves_norms():
    rope = RotaryEmbedding(head_dim=10, max_seq_len=33).double()
    x = torch.randn(2, 3, 33, 10, dtype=torch.float64)
    torch.testing.assert_close(rope(x).norm(dim=-1), x.norm(dim=-1))


def test_sdpa_matches_naive_in_float64():
    q, k, v = (torch.randn(2, 3, 37, 16, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(get_attention("sdpa")(q, k, v), naive_attention(q, k, v))


def test_naive_attention_is_causal_softmax_against_a_loop():
    q, k, v = (torch.randn(1, 1, 9, 8, dtype=torch.float64) for _ in range(3))
    out = naive_attention(q, k, v)
    for t in range(9):
        weights = torch.softmax(q[0, 0, t] @ k[0, 0, : t + 1].T / 8**0.5, dim=-1)
        torch.testing.assert_close(out[0, 0, t], weights @ v[0, 0, : t + 1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_sdpa_cudnn_matches_naive_on_the_gpu():
    q, k, v = (torch.randn(2, 3, 257, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    reference = naive_attention(q.double(), k.double(), v.double())
    error = (get_attention("sdpa-cudnn")(q, k, v).double() - reference).abs().max()
    same_dtype = (get_attention("sdpa")(q, k, v).double() - reference).abs().max()
    assert error <= 2 * same_dtype + 1e-3


def test_registry_names_and_unknown_backend():
    assert {"naive", "sdpa", "sdpa-cudnn", "flash", "flash-torch"} <= set(attention_backends())
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        get_attention("fast")


def test_naive_attention_opens_its_named_ranges_under_the_profiler():
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        naive_attention(q, k, v)
    names = {event.name for event in prof.events()}
    assert {"attention/scores", "attention/mask", "attention/softmax", "attention/output"} <= names
