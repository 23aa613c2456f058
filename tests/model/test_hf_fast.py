"""apply_to_hf_model on transformers' Llama, Qwen2 and Mistral against the unpatched model.

Each family at a tiny odd size with what makes it itself: Llama with grouped key/value heads and
llama3 RoPE scaling, Qwen2 with q/k/v biases, one key/value head and tied embeddings, Mistral with
a sliding window longer than the sequence. The loss (labels with -100) and every parameter's
gradient match the unpatched model in fp32 and stay within the error bf16 allows under autocast.
Without CUDA the kernels run in Triton's interpreter (`test_hf_fast_in_interpreter` reruns this
file with TRITON_INTERPRET=1) and attention is flash-torch; refusals need no kernel and run here.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from triton_child import module_under_test, rerun_in_interpreter

transformers = pytest.importorskip("transformers")

from lmscope.model.hf_fast import plan_fast_patch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATTENTION = "flash" if DEVICE == "cuda" else "flash-torch"
SEQ = 11
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8, "rope_theta": 500000.0}
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, vocab_size=53, rope_scaling=LLAMA3)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=40, intermediate_size=36, num_hidden_layers=2, num_attention_heads=5,
        num_key_value_heads=1, vocab_size=47, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=32, head_dim=8, intermediate_size=28, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=41, sliding_window=16, rope_theta=1e6)),
}


def test_hf_fast_in_interpreter() -> None:
    rerun_in_interpreter(__file__)


@pytest.fixture(scope="module")
def hf_fast():
    return module_under_test("lmscope.model.hf_fast", "test_hf_fast_in_interpreter")


def _model(family: str, seed: int, **changes) -> nn.Module:
    config_name, model_name, fields = FAMILIES[family]
    config = getattr(transformers, config_name)(**{**fields, "max_position_embeddings": 32, **changes})
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = getattr(transformers, model_name)._from_config(config, attn_implementation="sdpa")
    return model.float()


def _pair(hf_fast, family: str, seed: int, attention: str = ATTENTION):
    reference = _model(family, seed)
    fast = copy.deepcopy(reference)
    patch = hf_fast.apply_to_hf_model(fast, attention=attention)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, reference.config.vocab_size, (2, SEQ), generator=gen).to(DEVICE)
    labels = tokens.clone()
    labels[0, :3] = -100  # e.g. a prompt: no loss there
    return reference, fast, patch, tokens, labels


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.double() for name, p in model.named_parameters()}


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize(("family", "attention"), [*((f, ATTENTION) for f in FAMILIES), ("llama", "sdpa")])
def test_fp32_loss_logits_and_every_gradient_match_the_unpatched_model(hf_fast, family, attention) -> None:
    reference, fast, patch, tokens, labels = _pair(hf_fast, family, seed=len(family), attention=attention)
    params = [id(p) for p in fast.parameters()]
    ref = reference(input_ids=tokens, labels=labels)
    ours = fast(input_ids=tokens, labels=labels)
    assert ours.logits is None  # the fused head never builds them
    ref.loss.backward()
    ours.loss.backward()
    assert abs(ours.loss.item() - ref.loss.item()) < 1e-5 * abs(ref.loss.item())
    theirs, mine = _grads(reference), _grads(fast)
    assert list(mine) == list(theirs)
    for name in theirs:
        assert _rel(mine[name], theirs[name]) < 1e-5, name
    with torch.no_grad():
        torch.testing.assert_close(fast(input_ids=tokens).logits, reference(input_ids=tokens).logits,
                                   rtol=1e-5, atol=1e-5)
    assert [id(p) for p in fast.parameters()] == params  # the model's own weights, not copies
    layers = reference.config.num_hidden_layers
    assert patch.summary() == f"norm={2 * layers + 1},mlp={layers},attention={layers},causal_lm=1"
    assert patch.replaced["attention"][0] == "model.layers.0.self_attn"
    assert patch.families == (family,) and hf_fast.fast_patch_of(fast) is patch
    assert fast.config._attn_implementation.startswith("lmscope_")  # transformers builds no mask


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_bf16_autocast_within_the_error_of_the_unpatched_bf16_model(hf_fast, family) -> None:
    """Both under bf16 autocast, compared with the unpatched model in fp32."""
    reference, fast, _, tokens, labels = _pair(hf_fast, family, seed=7)
    exact = reference(input_ids=tokens, labels=labels).loss
    exact.backward()
    exact_grads = _grads(reference)
    reference.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        eager = reference(input_ids=tokens, labels=labels).loss
        ours = fast(input_ids=tokens, labels=labels).loss
    eager.backward()
    ours.backward()
    assert ours.dtype == torch.float32
    # the interpreter truncates fp32 -> bf16 where the GPU rounds (see tests/kernels/test_rmsnorm.py)
    factor = 3.0 if DEVICE == "cpu" else 2.0
    assert abs(ours.item() - exact.item()) <= factor * abs(eager.item() - exact.item()) + 2e-3
    theirs, mine = _grads(reference), _grads(fast)
    total_ours = sum(_rel(mine[n], exact_grads[n]) for n in exact_grads)
    total_eager = sum(_rel(theirs[n], exact_grads[n]) for n in exact_grads)
    assert total_ours <= factor * total_eager


def test_shift_labels_and_num_items_in_batch_are_transformers_loss(hf_fast) -> None:
    reference, fast, _, tokens, labels = _pair(hf_fast, "llama", seed=3)
    shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    items = torch.tensor(13, device=DEVICE)
    with torch.no_grad():
        ref = reference(input_ids=tokens, labels=labels, num_items_in_batch=items).loss
        ours = fast(input_ids=tokens, labels=labels, num_items_in_batch=items).loss
        given = fast(input_ids=tokens, shift_labels=shifted).loss
        mean = reference(input_ids=tokens, labels=labels).loss
    assert abs(ours.item() - ref.item()) < 1e-5 * abs(ref.item())
    assert abs(given.item() - mean.item()) < 1e-5 * abs(mean.item())
    assert abs(ref.item() - mean.item()) > 1e-2 * abs(mean.item())  # sum / 13 is not the mean


def test_a_model_of_family_modules_without_a_head(hf_fast) -> None:
    """The base LlamaModel: norms, MLPs and attention replaced; the hidden states unchanged."""
    reference = _model("llama", seed=5).model
    fast = copy.deepcopy(reference)
    patch = hf_fast.apply_to_hf_model(fast, attention=ATTENTION)
    tokens = torch.randint(0, 53, (2, SEQ), device=DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(fast(input_ids=tokens).last_hidden_state,
                                   reference(input_ids=tokens).last_hidden_state, rtol=1e-5, atol=1e-5)
    assert patch.summary() == "norm=5,mlp=2,attention=2"


def test_masks_caches_and_windows(hf_fast) -> None:
    reference, fast, _, tokens, _ = _pair(hf_fast, "mistral", seed=9)
    ones = torch.ones_like(tokens)
    with torch.no_grad():
        prefill = fast(input_ids=tokens, attention_mask=ones, use_cache=True)
        torch.testing.assert_close(prefill.logits, reference(input_ids=tokens).logits, rtol=1e-5, atol=1e-5)
        assert prefill.past_key_values.get_seq_length() == SEQ  # the cache is filled
        with pytest.raises(ValueError, match="decoding with a KV cache"):
            fast(input_ids=tokens[:, -1:], past_key_values=prefill.past_key_values, use_cache=True)
        padded = ones.clone()
        padded[1, :4] = 0
        with pytest.raises(ValueError, match="no padding mask"):
            fast(input_ids=tokens, attention_mask=padded)
        fast.config.sliding_window = SEQ - 1
        with pytest.raises(ValueError, match="longer than the sliding window 10"):
            fast(input_ids=tokens)


def test_fused_adamw_keeps_the_bf16_copies_current(hf_fast) -> None:
    """patch.fused_adamw against torch's AdamW on the same patched model: the same weights after
    bf16 steps (stale copies would feed step 2 old weights), and copies equal to the weights."""
    models = [_model("qwen2", seed=11) for _ in range(2)]
    patches = [hf_fast.apply_to_hf_model(m, attention=ATTENTION) for m in models]
    lr, atol = 1e-2, 3e-3  # AdamW moves a weight ~lr per step: well above atol
    # eps well above rounding noise: the key bias's gradient is zero up to rounding (softmax is
    # shift-invariant), and AdamW would turn that noise into steps of ~lr in either direction
    options = dict(lr=lr, eps=1e-4)
    optimizers = [patches[0].fused_adamw(**options), torch.optim.AdamW(models[1].parameters(), **options)]
    tokens = torch.randint(0, 47, (2, SEQ), device=DEVICE)
    before = [p.detach().clone() for p in models[1].parameters()]
    for _ in range(3):
        for model, optimizer in zip(models, optimizers, strict=True):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(DEVICE, dtype=torch.bfloat16):
                model(input_ids=tokens, labels=tokens).loss.backward()
            optimizer.step()
    shadows = patches[0].current_shadows()
    assert shadows is not None and len(shadows.groups) == 4 * 2  # qkv, o, gate|up, down per layer
    for weight, view in shadows.views.items():
        # the interpreter truncates fp32 -> bf16 stores where the GPU rounds: 1 ulp apart
        rounded = weight.detach().to(torch.bfloat16).float()
        torch.testing.assert_close(view.float(), rounded, rtol=2**-7, atol=0)
    for a, (name, b), b0 in zip(models[0].parameters(), models[1].named_parameters(), before, strict=True):
        # every tensor but the key bias moved by well over the tolerance: a no-op optimizer fails
        assert name.endswith("k_proj.bias") or (b - b0).abs().max() > 2 * atol, name
        torch.testing.assert_close(a, b, rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def _lora_like(model: nn.Module) -> None:
    class Adapter(nn.Linear):
        pass

    layer = model.model.layers[0].self_attn
    layer.q_proj = Adapter(layer.q_proj.in_features, layer.q_proj.out_features)


@pytest.mark.parametrize(("family", "change", "message"), [
    ("llama", {"attention_dropout": 0.1}, "attention_dropout 0.1"),
    ("qwen2", {"hidden_act": "gelu"}, "activation 'gelu'"),
    ("llama", _lora_like, r"q_proj is a Adapter, not a torch.nn.Linear"),
])
def test_refusals_are_one_line_and_change_nothing(family, change, message) -> None:
    if callable(change):
        model = _model(family, seed=1)
        change(model)
    else:
        model = _model(family, seed=1, **change)
    forwards = {name: m.forward for name, m in model.named_modules()}
    with pytest.raises(ValueError, match=message) as caught:
        plan_fast_patch(model)
    assert "\n" not in str(caught.value)
    assert {name: m.forward for name, m in model.named_modules()} == forwards
    assert getattr(model, "lmscope_fast", None) is None


def test_other_families_and_attentions_are_refused() -> None:
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2))
    with pytest.raises(ValueError, match="llama, qwen2, mistral"):
        plan_fast_patch(gpt2)
    with pytest.raises(ValueError, match="choose one of flash, flash-torch, sdpa, sdpa-cudnn"):
        plan_fast_patch(_model("llama", seed=1), attention="naive")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("family", "sizes"), [
    ("llama", dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                   vocab_size=128256, tie_word_embeddings=True)),
    ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                   vocab_size=151936)),
    ("mistral", dict(hidden_size=4096, head_dim=128, intermediate_size=14336, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=32000, sliding_window=4096)),
])
def test_real_sizes_bf16_on_gpu(hf_fast, family, sizes) -> None:
    """Two layers of the real widths, batch 2 x 1024, lmscope's Triton FlashAttention."""
    torch.manual_seed(0)
    config_name, model_name, _ = FAMILIES[family]
    config = getattr(transformers, config_name)(**sizes, num_hidden_layers=2, max_position_embeddings=4096)
    with torch.device("cuda"):
        reference = getattr(transformers, model_name)._from_config(config, attn_implementation="sdpa").float()
    fast = copy.deepcopy(reference)
    hf_fast.apply_to_hf_model(fast, attention="flash")
    tokens = torch.randint(0, config.vocab_size, (2, 1024), device="cuda")
    exact = reference(input_ids=tokens, labels=tokens).loss
    exact.backward()
    exact_grads = _grads(reference)
    reference.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = reference(input_ids=tokens, labels=tokens).loss
        ours = fast(input_ids=tokens, labels=tokens).loss
    eager.backward()
    ours.backward()
    assert abs(ours.item() - exact.item()) <= 2 * abs(eager.item() - exact.item()) + 2e-3
    theirs, mine = _grads(reference), _grads(fast)
    for name in exact_grads:
        assert _rel(mine[name], exact_grads[name]) <= 2 * _rel(theirs[name], exact_grads[name]) + 1e-3, name
