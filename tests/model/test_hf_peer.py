"""The HF transformers Llama peer: same sizes and parameter count, runs in TrainStep, clear errors."""

from __future__ import annotations

import sys

import pytest
import torch

from lmscope.accounting.flops import parameter_counts
from lmscope.config import preset
from lmscope.model.hf_peer import HFLlamaPeer, llama_config_kwargs
from lmscope.workloads.step import Spec

CONFIG = preset("tiny", vocab_size=101, d_model=36, d_ff=52, num_heads=3, num_layers=3, context_length=16)


def test_llama_config_has_our_sizes_untied_and_sdpa() -> None:
    kwargs = llama_config_kwargs(CONFIG)
    assert (kwargs["hidden_size"], kwargs["intermediate_size"], kwargs["num_hidden_layers"]) == (36, 52, 3)
    assert kwargs["num_attention_heads"] == kwargs["num_key_value_heads"] == 3
    assert (kwargs["vocab_size"], kwargs["max_position_embeddings"]) == (101, 16)
    assert kwargs["rope_theta"] == CONFIG.rope_theta and kwargs["rms_norm_eps"] == 1e-5
    assert kwargs["tie_word_embeddings"] is False and kwargs["attn_implementation"] == "sdpa"
    assert kwargs["attention_bias"] is False and kwargs["mlp_bias"] is False


@pytest.mark.parametrize("config", [CONFIG, preset("tiny", vocab_size=77, num_layers=1)])
def test_parameter_count_equals_ours(config) -> None:
    pytest.importorskip("transformers")
    peer = HFLlamaPeer(config)
    assert sum(p.numel() for p in peer.parameters()) == parameter_counts(config)["total"]
    assert peer.llama.config._attn_implementation == "sdpa"


def test_train_step_runs_the_peer() -> None:
    pytest.importorskip("transformers")
    from lmscope.workloads.train_step import TrainStep

    step = TrainStep(Spec(peer="hf", attention="sdpa", vocab_size=101, d_model=36, d_ff=52, num_heads=3,
                          num_layers=3, context_length=9, batch_size=2, mode="forward-backward",
                          device="cpu"))
    assert isinstance(step.model, HFLlamaPeer)
    loss = step.loss()
    assert loss.ndim == 0 and abs(loss.item() - torch.log(torch.tensor(101.0)).item()) < 1.0
    step()
    assert all(p.grad is not None for p in step.model.parameters())


def test_missing_transformers_says_install_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ValueError, match=r"install lmscope\[hf\]"):
        HFLlamaPeer(CONFIG)


def test_spec_checks_the_peer() -> None:
    with pytest.raises(ValueError, match="unknown peer"):
        Spec(peer="compile")
    with pytest.raises(ValueError, match="--attention sdpa"):
        Spec(peer="hf")
    assert Spec(peer="hf", attention="sdpa").peer == "hf"
