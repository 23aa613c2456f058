"""Model sources resolved and built on the CPU: presets, transformers configs, user factories."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from lmscope.accounting.flops import parameter_counts
from lmscope.sources import ModelRequest, UserModel, resolve_source
from lmscope.sources.factory import call_factory, factory_kwargs, load_factory
from lmscope.workloads.model_spec import ModelPointSpec
from lmscope.workloads.train_step import TrainStep

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
OWN_LM = f"{ROOT / 'examples' / 'own_lm.py'}:build"
SMALL_HF = {"d_model": 48, "num_layers": 3, "num_heads": 4, "vocab_size": 101}


@pytest.fixture
def support_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    paths = [str(SUPPORT), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))


def test_preset_source_is_the_reference_model():
    source = resolve_source(ModelRequest(name="tiny", d_model=32, num_heads=2, context_length=40))
    assert (source.kind, source.unit, source.blocks, source.context_limit) == ("preset", "tokens", 2, 40)
    built = source.build(torch.device("cpu"))
    assert sum(p.numel() for p in built.model.parameters()) == parameter_counts(source.config)["total"]
    inputs, targets = built.make_batch(3, 7, torch.device("cpu"))
    assert inputs.shape == targets.shape == (3, 7) and int(inputs.max()) < source.config.vocab_size


@pytest.mark.parametrize(("model_type", "names"), [
    ("gpt2", {"n_embd": 48, "n_layer": 3, "n_head": 4, "vocab_size": 101}),
    ("llama", {"hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4, "vocab_size": 101}),
])
def test_hf_overrides_map_to_the_config_names_and_positions_grow_to_the_context(model_type, names):
    request = ModelRequest(name=f"hf:{model_type}", context_length=3000, attention="sdpa", **SMALL_HF)
    source = resolve_source(request)
    assert (source.kind, source.unit, source.blocks, source.config) == ("hf", "tokens", 3, None)
    assert source.context_limit == 3000  # gpt2's 1024 positions, llama's 2048, raised to the context
    model = source.build(torch.device("cpu")).model
    config = model.lm.config
    assert {name: getattr(config, name) for name in names} == names
    assert config._attn_implementation == "sdpa" and not config.use_cache
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_hf_num_heads_keeps_multi_head_configs_multi_head():
    source = resolve_source(ModelRequest(name="hf:qwen2", **SMALL_HF))
    config = source.build(torch.device("meta")).model.lm.config
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 4)


def test_hf_config_json_and_naive_attention_is_eager(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen2", "hidden_size": 40, "intermediate_size": 72,
                                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "vocab_size": 77, "architectures": ["Qwen2ForCausalLM"]}))
    source = resolve_source(ModelRequest(name=f"hf:{path}", d_ff=56, context_length=16))
    model = source.build(torch.device("cpu")).model
    config = model.lm.config
    assert (config.intermediate_size, config.num_key_value_heads, config.vocab_size) == (56, 2, 77)
    assert config._attn_implementation == "eager"
    mlp = model.lm.model.layers[0].mlp
    assert mlp.gate_proj.weight.shape == (56, 40)


def test_hf_grouped_query_model_with_lmscope_flash_attention_matches_sdpa(tmp_path):
    path = tmp_path / "gqa.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
                                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "vocab_size": 101}))
    fields = {"size": f"hf:{path}", "device": "cpu", "batch_size": 2, "context_length": 13,
              "mode": "forward-backward"}
    results = []
    for attention in ("sdpa", "flash-torch"):
        step = TrainStep(ModelPointSpec(attention=attention, **fields), seed=5)
        config = step.model.lm.config
        assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
        step()
        results.append((step.last_loss, [p.grad for p in step.model.parameters()]))
    (loss, grads), (flash_loss, flash_grads) = results
    torch.testing.assert_close(flash_loss, loss, rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(flash_grads, grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)


def test_hf_flash_attention_under_bf16_autocast_gets_one_dtype(tmp_path):
    """transformers applies RoPE in fp32 under autocast (fp32 q, k beside a bf16 v); lmscope's
    kernels take one dtype, so the wrapper casts to the autocast dtype as SDPA's autocast does."""
    path = tmp_path / "gqa.json"
    path.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
                                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "vocab_size": 101}))
    fields = {"size": f"hf:{path}", "device": "cpu", "batch_size": 2, "context_length": 13,
              "mode": "forward-backward", "precision": "bf16"}
    losses = []
    for attention in ("sdpa", "flash-torch"):
        step = TrainStep(ModelPointSpec(attention=attention, **fields), seed=5)
        step()
        losses.append(step.last_loss.float().item())
    assert losses[1] == pytest.approx(losses[0], rel=1e-2)


def test_checkpointed_hf_layers_give_the_same_gradients():
    spec = {"size": "hf:llama", "device": "cpu", "batch_size": 2, "context_length": 11,
            "mode": "forward-backward", **SMALL_HF}
    grads = []
    for policy in ("none", "every:2"):
        step = TrainStep(ModelPointSpec(**spec), seed=3)
        from lmscope.model.checkpointing import checkpoint_blocks

        assert len(checkpoint_blocks(step.built.blocks, policy)) == {"none": 0, "every:2": 2}[policy]
        step()
        grads.append([p.grad.clone() for p in step.model.parameters()])
    for plain, checkpointed in zip(*grads, strict=True):
        torch.testing.assert_close(checkpointed, plain, rtol=1e-5, atol=1e-6)


def test_factory_gets_the_arguments_its_signature_names():
    factory = load_factory(OWN_LM)
    request = ModelRequest(name=OWN_LM, d_model=24, num_heads=2, context_length=33)
    assert factory_kwargs(factory, request) == {"d_model": 24, "num_heads": 2, "context_length": 33}
    with pytest.raises(ValueError, match="takes no attention argument: drop --attention sdpa"):
        factory_kwargs(factory, ModelRequest(name=OWN_LM, attention="sdpa"))
    source = resolve_source(ModelRequest(name=OWN_LM, d_model=24, num_layers=3, num_heads=2, vocab_size=50,
                                         context_length=33))
    assert (source.kind, source.unit, source.blocks, source.has_optimizer) == ("factory", "tokens", 3, False)
    built = source.build(torch.device("cpu"))
    assert isinstance(built, UserModel) and built.model.positions.num_embeddings == 33
    assert next(built.model.parameters()).device.type == "cpu"


def test_a_model_the_factory_made_elsewhere_is_moved_to_the_point_device():
    """A factory may return a model it did not make under ``with device:`` (one loaded earlier on
    the CPU, say): the source moves it to the point's device, here a fake CUDA device
    (FakeTensorMode), so that this runs without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    loaded = torch.nn.Linear(4, 1)  # on the CPU, before any point's device is known

    def factory() -> UserModel:
        return UserModel(model=loaded, make_batch=lambda *args: None, loss=lambda *args: None)

    with FakeTensorMode(allow_non_fake_inputs=True):
        built = call_factory(factory, {}, "loaded:factory", torch.device("cuda"))
    assert {p.device.type for p in built.model.parameters()} == {"cuda"}


def test_factory_in_a_module_and_the_meta_check_falls_back_to_the_cpu(support_on_path):
    source = resolve_source(ModelRequest(name="own_models:needs_cuda"))
    assert (source.unit, source.blocks) == ("samples", None)
    step = TrainStep(ModelPointSpec(size="own_models:regression", device="cpu", batch_size=5, d_model=6))
    assert step.model.weight.shape == (1, 6) and step.batch[0].shape == (5, 6)
    before = step.model.weight.detach().clone()
    step()
    assert not torch.equal(before, step.model.weight) and step.last_loss.ndim == 0
    assert step.model_facts() == {"model_source": "factory", "unit": "samples", "parameters": 7}


@pytest.mark.parametrize(("name", "message"), [
    ("own_models:raises", "own_models:raises raised RuntimeError: the checkpoint shard is missing"),
    ("own_models:wrong_type", "own_models:wrong_type returned a Linear, not an lmscope.sources.UserModel"),
    ("own_models:bad_unit", "UserModel.unit must be one of tokens, samples, got 'pixels'"),
    ("own_models:NOT_A_FUNCTION", "NOT_A_FUNCTION is a int, not a function"),
    ("own_models:nothing_here", "own_models has no 'nothing_here' (callables there:"),
    ("no_such_module_for_lmscope:build", "cannot import module 'no_such_module_for_lmscope'"),
    ("missing/model.py:build", "model file missing/model.py does not exist"),
    ("hf:no_such_model_type", "unknown transformers model_type 'no_such_model_type'"),
    ("hf:missing/config.json", "hf config missing/config.json does not exist"),
    ("hf:", "hf: needs a model_type or a config.json path"),
])
def test_bad_sources_are_one_line_value_errors(support_on_path, name, message):
    with pytest.raises(ValueError) as error:
        resolve_source(ModelRequest(name=name))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_file_that_does_not_import_names_the_file(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import torch\ndef build(:\n")
    with pytest.raises(ValueError, match=f"importing {path} failed: SyntaxError"):
        resolve_source(ModelRequest(name=f"{path}:build"))


def test_without_transformers_hf_says_what_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    with pytest.raises(ValueError, match=r"install lmscope\[hf\]"):
        resolve_source(ModelRequest(name="hf:mistral", num_layers=1))


@pytest.mark.parametrize(("fields", "message"), [
    ({"size": "hf:gpt2", "fast": True, "attention": "sdpa"},
     "GPT2LMHeadModel has no module of the families lmscope's fast path runs (transformers' llama, qwen2, "
     "mistral)"),
    ({"size": OWN_LM, "fast": True}, "--fast on runs lmscope's presets and transformers' Llama, Qwen2"),
    ({"size": "hf:gpt2", "attention": "flash"}, "attn_pdrop is 0.1, and lmscope's --attention flash has no"),
    ({"size": "hf:gpt2", "model_context_length": 64, "context_length": 100},
     "exceeds the model's context_length 64"),
])
def test_spec_refuses_what_a_source_cannot_do(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelPointSpec(device="cpu", **{**SMALL_HF, **fields})


@pytest.mark.parametrize("example", ["own_lm.py", "mlp.py"])
def test_the_docs_show_the_example_files_as_they_are(example):
    text = (ROOT / "examples" / example).read_text()
    assert f"```python\n{text}```" in (ROOT / "docs" / "own_model.md").read_text()
