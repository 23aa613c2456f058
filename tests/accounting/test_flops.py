"""Parameter and FLOP formulas against hand counts, real models and torch's FLOP counter."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lmscope.accounting.flops import (
    forward_flops,
    forward_flops_by_component,
    matmul_parameters,
    parameter_counts,
    phase_flops,
    step_flops,
)
from lmscope.config import PRESETS, ModelConfig
from lmscope.model.transformer import TransformerLM

# vocab 37, d 12, d_ff 20, 3 layers, 3 heads of 4: counted by hand below.
ODD = ModelConfig(vocab_size=37, d_model=12, d_ff=20, num_layers=3, num_heads=3, context_length=16)

DESIGN_COUNTS = {"small": 128_625_408, "medium": 423_183_360, "large": 969_411_840,
                 "xl": 1_998_235_200, "2.7B": 3_406_809_600}


def test_parameter_counts_by_hand():
    counts = parameter_counts(ODD)
    assert counts == {
        "embedding": 37 * 12,  # 444
        "attention": 3 * 4 * 12 * 12,  # q, k, v, out: 1728
        "ffn": 3 * 3 * 12 * 20,  # w1, w2, w3: 2160
        "norms": 3 * 2 * 12 + 12,  # ln1, ln2 per layer + ln_final: 84
        "lm_head": 12 * 37,  # 444
        "total": 4860,
    }
    assert matmul_parameters(ODD) == 1728 + 2160 + 444


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_count_matches_the_model_for_every_preset(name):
    config = PRESETS[name]
    with torch.device("meta"):
        model = TransformerLM(config)
    assert parameter_counts(config)["total"] == sum(p.numel() for p in model.parameters())
    if name in DESIGN_COUNTS:
        assert parameter_counts(config)["total"] == DESIGN_COUNTS[name]


def test_forward_flops_by_hand():
    # batch 2, seq 5: 10 tokens; dense 2 * 4332 * 10; attention 2 matmuls * 2 * (1+2+3+4+5 causal
    # pairs) * 12 * 3 layers * 2 seqs
    by_component = forward_flops_by_component(ODD, 2, 5)
    assert by_component == {
        "attention_proj": 2 * 1728 * 10, "attention_scores": 2160, "attention_values": 2160,
        "ffn": 2 * 2160 * 10, "lm_head": 2 * 444 * 10,
    }
    assert forward_flops(ODD, 2, 5) == {"dense": 86640, "attention": 4320, "total": 90960}
    assert sum(by_component.values()) == forward_flops(ODD, 2, 5)["total"]


@pytest.mark.parametrize("seq", [1, 6, 511, 512])
def test_causal_attention_counts_half_the_square_and_its_diagonal(seq):
    """The MFU convention: model FLOPs count the (query, key) pairs a causal model attends, T (T + 1)
    / 2, not the T x T square naive attention computes (that is `full_square`, never MFU's)."""
    causal = forward_flops(ODD, 3, seq)["attention"]
    square = forward_flops(ODD, 3, seq, full_square=True)["attention"]
    assert square == 3 * 3 * 4 * seq * seq * 12
    assert causal == square * (seq + 1) / (2 * seq)
    assert step_flops(ODD, 3, seq, "train-step") == 3 * forward_flops(ODD, 3, seq)["total"]
    assert (step_flops(ODD, 3, seq, "train-step", full_square=True) - step_flops(ODD, 3, seq, "train-step")
            == 3 * (square - causal))


@pytest.mark.parametrize(("batch", "seq"), [(1, 7), (3, 13)])
def test_flops_match_torch_flop_counter_forward_and_backward(batch, seq):
    torch.manual_seed(batch * seq)
    model = TransformerLM(ODD)
    tokens = torch.randint(0, ODD.vocab_size, (batch, seq))
    with FlopCounterMode(display=False) as counter:  # naive attention: the full square
        model(tokens)
    assert counter.get_total_flops() == forward_flops(ODD, batch, seq, full_square=True)["total"]
    with FlopCounterMode(display=False) as counter:
        model(tokens).square().mean().backward()
    assert counter.get_total_flops() == step_flops(ODD, batch, seq, "forward-backward", full_square=True)


def test_phase_flops_per_mode():
    forward = forward_flops(ODD, 2, 5)["total"]
    assert phase_flops(ODD, 2, 5, "forward") == {"forward": forward, "backward": 0.0, "step": forward}
    train = phase_flops(ODD, 2, 5, "train-step")
    assert train == {"forward": forward, "backward": 2 * forward, "step": 3 * forward}
    with pytest.raises(ValueError, match="unknown mode"):
        phase_flops(ODD, 2, 5, "backward-only")


def test_attention_share_grows_with_context():
    config = PRESETS["small"]
    shares = [forward_flops(config, 1, t)["attention"] / forward_flops(config, 1, t)["total"]
              for t in (128, 512, 2048)]
    assert shares[0] < shares[1] < shares[2]
