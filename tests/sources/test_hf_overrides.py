"""Size overrides on transformers configs: grouped-query heads, head_dim, per-family names, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lmscope.sources import ModelRequest, resolve_source
from lmscope.sources.hf_overrides import _kv_heads

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
LLAMA_1B_SHAPE = ROOT / "examples" / "llama-3.2-1b-shape.json"
TINY = {"num_layers": 1, "vocab_size": 97}


def _built(name: str, **overrides: int) -> tuple[object, object]:
    """The source and its model built on the CPU, after one forward of a small batch."""
    source = resolve_source(ModelRequest(name=name, context_length=16, **TINY, **overrides))
    built = source.build(torch.device("cpu"))
    batch = built.make_batch(2, 11, torch.device("cpu"))
    assert torch.isfinite(built.loss(built.model, batch))
    return source, built.model.lm.config


@pytest.mark.parametrize("name", ["hf:mistral", "hf:mixtral", f"hf:{LLAMA_1B_SHAPE}"])
def test_num_heads_on_a_grouped_query_config_keeps_its_group_and_says_so(name):
    source, config = _built(name, d_model=128, num_heads=4)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 1)  # 32:8 -> 4:1
    assert source.facts()["overrides_adjusted"] == (
        "num_key_value_heads 8 -> 1 (keeps 4 query heads per key/value head)")


def test_grouped_query_heads_that_do_not_divide_take_the_nearest_group():
    source, config = _built("hf:mistral", d_model=96, num_heads=6)
    assert (config.num_attention_heads, config.num_key_value_heads) == (6, 2)
    assert "3 query heads per key/value head: the config's 4 does not divide 6" in source.adjusted[0]


@pytest.mark.parametrize(("group", "heads", "expected"), [(4, 8, 2), (4, 6, 2), (4, 2, 1), (1, 5, 5),
                                                         (3, 7, 7), (2, 9, 3)])
def test_kv_heads_divide_the_heads_with_the_nearest_group(group, heads, expected):
    assert heads % _kv_heads(group, heads) == 0 and _kv_heads(group, heads) == expected


def test_multi_head_config_follows_the_heads_without_a_note():
    source, config = _built("hf:llama", d_model=64, num_heads=4)
    assert (config.num_key_value_heads, config.head_dim) == (4, 16)
    assert "overrides_adjusted" not in source.facts()


def test_head_dim_set_apart_from_the_width_follows_the_overrides_and_is_said():
    """gemma's head_dim 256 (not 3072 / 16) kept at --d-model 64 gave 3x the parameters asked for."""
    source, config = _built("hf:gemma", d_model=64, num_heads=4)
    assert config.head_dim == 16
    assert source.adjusted == ("head_dim 256 -> 16 (d_model / num_heads; the config's 256 is not 3072 / 16)",)
    attention = resolve_source(ModelRequest(name="hf:gemma", context_length=16, d_model=64, num_heads=4,
                                            **TINY)).build(torch.device("meta")).model.lm.model.layers[0]
    assert attention.self_attn.q_proj.weight.shape == (64, 64)


def test_width_without_a_whole_head_dim_is_refused():
    with pytest.raises(ValueError, match="d_model 66 is not a multiple of num_heads 4"):
        resolve_source(ModelRequest(name="hf:gemma", d_model=66, num_heads=4, **TINY))


@pytest.mark.parametrize(("name", "field"), [("hf:falcon", "ffn_hidden_size"), ("hf:t5", "d_ff")])
def test_d_ff_maps_to_the_family_name(name, field):
    from lmscope.sources.hf import hf_config

    config = hf_config(ModelRequest(name=name, d_model=64, num_heads=4, d_ff=80, **TINY))
    assert getattr(config, field) == 80


def test_falcon_d_ff_builds_its_mlp():
    _, config = _built("hf:falcon", d_model=64, num_heads=4, d_ff=80)
    assert config.ffn_hidden_size == 80


def test_vocab_below_the_pad_token_is_one_line_not_a_traceback():
    with pytest.raises(ValueError) as refused:
        resolve_source(ModelRequest(name="hf:phi3", d_model=64, num_heads=4, **{**TINY, "vocab_size": 1000}))
    assert "hf:phi3" in str(refused.value) and "\n" not in str(refused.value)
    assert "pad_token_id 32000" in str(refused.value)


def test_rows_and_the_console_say_what_was_adjusted():
    from lmscope.cli.sweep import adjusted_sources
    from lmscope.workloads.step import Spec, throughput_metrics

    spec = Spec(size="hf:mistral", d_model=64, num_heads=4, num_layers=1, vocab_size=97, device="cpu",
                context_length=8)
    note = "num_key_value_heads 8 -> 1 (keeps 4 query heads per key/value head)"
    assert throughput_metrics(spec, 1.0, None, 10)["overrides_adjusted"] == note
    assert adjusted_sources([spec, spec]) == [f"hf:mistral: adjusted with the overrides: {note}"]
    assert adjusted_sources([Spec(size="tiny", device="cpu")]) == []


def test_cli_refuses_a_vocab_below_the_pad_token_in_one_line(capsys):
    from lmscope.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--model", "hf:phi3", "--vocab-size", "1000", "--d-model", "64", "--num-heads", "4",
              "--num-layers", "1", "--device", "cpu"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and "pad_token_id" in err
