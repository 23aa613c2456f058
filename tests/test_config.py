"""ModelConfig presets and validation messages."""

import pytest
import torch

from lmscope.accounting.flops import parameter_counts
from lmscope.config import PRESETS, ModelConfig, preset
from lmscope.model.transformer import TransformerLM

STUDY_PARAMETERS = {
    "small": 128_625_408,
    "medium": 423_183_360,
    "large": 969_411_840,
    "xl": 1_998_235_200,
    "2.7B": 3_406_809_600,
}


@pytest.mark.parametrize("name", list(STUDY_PARAMETERS))
def test_preset_parameter_counts_match_the_study_table(name):
    with torch.device("meta"):
        model = TransformerLM(preset(name))
    assert sum(p.numel() for p in model.parameters()) == STUDY_PARAMETERS[name]
    assert parameter_counts(preset(name))["total"] == STUDY_PARAMETERS[name]


def test_presets_have_the_study_shapes():
    assert (PRESETS["xl"].d_model, PRESETS["xl"].d_ff, PRESETS["xl"].num_layers) == (1600, 6400, 48)
    assert PRESETS["2.7B"].num_heads == 32 and PRESETS["small"].vocab_size == 10_000


def test_overrides_replace_only_given_fields():
    config = preset("small", num_layers=3, d_model=None)
    assert config.num_layers == 3 and config.d_model == 768


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ValueError, match="unknown model size 'huge'.*tiny, small, medium, large, xl, 2.7B"):
        preset("huge")


def test_preset_names_are_case_insensitive():
    assert preset("XL") == PRESETS["xl"] and preset("2.7b") == PRESETS["2.7B"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"d_model": 0}, "d_model must be a positive integer.*--d-model"),
        ({"num_layers": -2}, "num_layers must be a positive integer"),
        ({"d_model": 64, "num_heads": 7}, "not divisible by num_heads 7"),
        ({"d_model": 66, "num_heads": 6}, "head dimension .* is odd"),
        ({"rope_theta": 0.0}, "rope_theta must be positive"),
    ],
)
def test_invalid_configs_say_what_to_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields)


NEWER_EDITION = {  # (d_model, d_ff, layers, heads, vocab) as the newer edition of the study gives them
    "xl-2025": (2560, 10240, 32, 32, 10_000),
    "10b-2025": (4608, 12288, 50, 36, 10_000),
    "8b-long": (4096, 11008, 34, 32, 151_936),
}


@pytest.mark.parametrize("name", list(NEWER_EDITION))
def test_newer_edition_presets_have_their_shapes_and_counted_parameters(name):
    config = preset(name)
    assert (config.d_model, config.d_ff, config.num_layers, config.num_heads,
            config.vocab_size) == NEWER_EDITION[name]
    with torch.device("meta"):
        model = TransformerLM(config.replace(context_length=16))
    d, f, layers, _, vocab = NEWER_EDITION[name]
    by_hand = 2 * vocab * d + layers * (4 * d * d + 3 * d * f + 2 * d) + d
    assert sum(p.numel() for p in model.parameters()) == parameter_counts(config)["total"] == by_hand


def test_old_names_keep_their_meaning_beside_the_new_ones():
    assert preset("xl") != preset("xl-2025") and preset("XL-2025") == preset("xl-2025")
    assert preset("8b-long").context_length == 32_768


def test_readme_presets_table_is_generated():
    from pathlib import Path

    from lmscope.planning.plan_checkpoint import presets_markdown

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    table = readme.split("<!-- presets:start -->\n")[1].split("<!-- presets:end -->")[0]
    assert table == presets_markdown(), "regenerate it: lmscope plan presets --format md"
