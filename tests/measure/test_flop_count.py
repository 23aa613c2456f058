"""The FLOP counter against hand counts and against lmscope.accounting.flops on the presets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmscope.accounting.flops import step_flops
from lmscope.measure.flop_count import attention_flops, causal_pairs, count_phases, count_step
from lmscope.workloads.step import Spec
from lmscope.workloads.train_step import TrainStep


def tiny_train_step(**fields: object) -> TrainStep:
    """lmscope's tiny preset (vocabulary cut to 97) on the CPU."""
    return TrainStep(Spec(size="tiny", vocab_size=97, device="cpu", **fields))


def test_causal_pairs_match_a_mask_count() -> None:
    for n_q, n_k in [(1, 1), (7, 7), (5, 9), (9, 5), (13, 1)]:
        mask = torch.ones(n_q, n_k, dtype=torch.bool).tril()
        assert causal_pairs(n_q, n_k) == int(mask.sum())


def test_linear_and_matmul_by_hand() -> None:
    x = torch.randn(3, 5, 7, requires_grad=True)
    linear = torch.nn.Linear(7, 11)
    b = torch.randn(3, 7, 13)
    state = {}
    counts = count_phases([
        ("forward", lambda: state.update(y=linear(x).sum() + (x @ b).sum())),
        ("backward", lambda: state["y"].backward()),
    ])
    linear_fwd = 2 * 15 * 7 * 11
    matmul_fwd = 2 * 3 * 5 * 7 * 13
    assert counts.phases["forward"].flops == linear_fwd + matmul_fwd
    # backward: grad input and grad weight of the linear, grad x of the matmul (b needs none)
    assert counts.phases["backward"].flops == 2 * linear_fwd + matmul_fwd
    assert counts.phases["forward"].attention_flops == 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("n_q", "n_k"), [(11, 11), (7, 13), (13, 7)])
def test_sdpa_by_hand(causal: bool, n_q: int, n_k: int) -> None:
    b, h, d, dv = 2, 3, 5, 5
    q = torch.randn(b, h, n_q, d, requires_grad=True)
    k = torch.randn(b, h, n_k, d, requires_grad=True)
    v = torch.randn(b, h, n_k, dv, requires_grad=True)
    state = {}
    counts = count_phases([
        ("forward", lambda: state.update(y=F.scaled_dot_product_attention(q, k, v, is_causal=causal))),
        ("backward", lambda: state["y"].sum().backward()),
    ])
    square = 2 * b * h * n_q * n_k * (d + dv)
    pairs = int(torch.ones(n_q, n_k).tril().sum()) if causal else n_q * n_k
    half = 2 * b * h * pairs * (d + dv)
    fwd, bwd = counts.phases["forward"], counts.phases["backward"]
    assert (fwd.flops, bwd.flops) == (half, 2 * half)  # model FLOPs: the causal pairs
    assert (fwd.flops_full_square, bwd.flops_full_square) == (square, 2 * square)
    assert fwd.attention_flops == square
    assert counts.total == 3 * half and counts.total_full_square == 3 * square


def _cuda_sdpa(backend: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> list:
    """(forward, backward) of one of SDPA's CUDA kernels, its aten ops called as SDPA's autograd
    calls them on a GPU (the backward fed the forward's outputs)."""
    aten, state = torch.ops.aten, {}
    if backend == "flash":
        def forward():
            state["out"] = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)

        def backward():
            o, lse, cum_q, cum_k, max_q, max_k, seed, offset = state["out"][:8]
            aten._scaled_dot_product_flash_attention_backward(
                o, q, k, v, o, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset)
    elif backend == "efficient":
        def forward():
            state["out"] = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal)

        def backward():
            o, lse, seed, offset = state["out"]
            aten._scaled_dot_product_efficient_attention_backward(
                o, q, k, v, None, o, lse, seed, offset, 0.0, [True, True, True, False], causal)
    else:
        def forward():
            state["out"] = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal)

        def backward():
            o, lse, cum_q, cum_k, max_q, max_k, seed, offset = state["out"][:8]
            aten._scaled_dot_product_cudnn_attention_backward(
                o, q, k, v, o, lse, seed, offset, None, cum_q, cum_k, max_q, max_k, 0.0, causal)
    return [("forward", forward), ("backward", backward)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["flash", "efficient", "cudnn"])
def test_cuda_sdpa_kernels_by_hand_on_fake_tensors(backend: str, causal: bool) -> None:
    """SDPA's CUDA kernels counted without a GPU: their ops on fake CUDA tensors (their meta
    kernels run). Model FLOPs, the full square and the causal pairs, with n_q != n_k and (where
    the kernel allows it) a value head dim other than the query's; the backward's recomputation
    of the scores is not counted. On a GPU, through F.scaled_dot_product_attention:
    test_flop_count_gpu.py."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    b, h, n_q, n_k, d = 2, 3, 203, 150, 64
    d_v = d if backend == "flash" else 48
    with FakeTensorMode():
        q, k, v = (torch.empty(b, h, n, dim, device="cuda", dtype=torch.bfloat16)
                   for n, dim in ((n_q, d), (n_k, d), (n_k, d_v)))  # fmt: skip
        counts = count_phases(_cuda_sdpa(backend, q, k, v, causal))
    pairs = causal_pairs(n_q, n_k) if causal else n_q * n_k
    square, half = 2 * b * h * n_q * n_k * (d + d_v), 2 * b * h * pairs * (d + d_v)
    fwd, bwd = counts.phases["forward"], counts.phases["backward"]
    assert (fwd.flops, bwd.flops) == (half, 2 * half)  # model FLOPs: the causal pairs
    assert (fwd.flops_full_square, bwd.flops_full_square) == (square, 2 * square)
    assert (fwd.attention_flops, bwd.attention_flops) == (square, 2 * square)


def test_attention_formula_with_grouped_query_heads() -> None:
    # 8 query heads over 2 key/value heads: the work is per query head
    flops = attention_flops((2, 8, 9, 4), (2, 2, 9, 4), (2, 2, 9, 4), causal=True, backward=False,
                            causal_half=True)
    assert flops == 2 * 2 * 8 * causal_pairs(9, 9) * 8


@pytest.mark.parametrize("attention", ["naive", "sdpa", "flash-torch"])
@pytest.mark.parametrize("mode", ["forward", "forward-backward", "train-step"])
def test_preset_count_equals_accounting(attention: str, mode: str) -> None:
    step = tiny_train_step(attention=attention, mode=mode, batch_size=2, context_length=37)
    counts = count_step(step)
    spec = step.spec
    shape = (spec.model_config(), spec.batch_size, spec.context_length, mode)
    # naive's masked matmuls are plain matmuls: the full square, above the model FLOPs
    assert counts.total == step_flops(*shape, full_square=attention == "naive")
    assert counts.total_full_square == step_flops(*shape, full_square=True)
    expected_phases = ["forward"] if mode == "forward" else ["forward", "backward"]
    if mode == "train-step":
        expected_phases.append("optimizer")
        assert counts.phases["optimizer"].flops == 0
    assert list(counts.phases) == expected_phases
    if mode != "forward":
        assert counts.phases["backward"].flops == 2 * counts.phases["forward"].flops
    if attention != "naive":
        assert counts.total < counts.total_full_square


def test_flash_functions_are_restored_after_counting() -> None:
    from lmscope.kernels.flash_attention_torch import FlashAttentionTorch

    forward = FlashAttentionTorch.forward
    count_step(tiny_train_step(attention="flash-torch", mode="forward-backward", batch_size=1,
                               context_length=9))
    assert FlashAttentionTorch.forward is forward


def test_hf_llama_within_one_percent_of_accounting() -> None:
    pytest.importorskip("transformers")
    step = tiny_train_step(attention="sdpa", mode="forward-backward", batch_size=2, context_length=33,
                           peer="hf")
    spec = step.spec
    analytic = step_flops(spec.model_config(), spec.batch_size, spec.context_length, spec.mode)
    assert abs(count_step(step).total / analytic - 1) < 0.01


def test_hf_llama_with_grouped_query_heads_by_hand() -> None:
    transformers = pytest.importorskip("transformers")
    d, ff, layers, heads, kv_heads, vocab, b, t = 48, 80, 2, 6, 2, 71, 2, 29
    config = transformers.LlamaConfig(hidden_size=d, intermediate_size=ff, num_hidden_layers=layers,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads,
                                      vocab_size=vocab, attn_implementation="sdpa", use_cache=False)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, vocab, (b, t))
    state = {}
    counts = count_phases([
        ("forward", lambda: state.update(loss=model(input_ids=ids, labels=ids).loss)),
        ("backward", lambda: state["loss"].backward()),
    ])
    kv = d // heads * kv_heads
    dense = 2 * b * t * (layers * (2 * d * d + 2 * d * kv + 3 * d * ff) + d * vocab)
    attention = layers * b * 4 * t * t * d  # the full square; transformers' SDPA call is causal
    forward = dense + attention * causal_pairs(t, t) / (t * t)
    assert abs(counts.phases["forward"].flops / forward - 1) < 0.01
    assert abs(counts.total / (3 * forward) - 1) < 0.01
    assert counts.phases["forward"].attention_flops == attention


@pytest.mark.parametrize("op", ["addmm", "baddbmm", "mm", "bmm"])
def test_matmuls_with_an_out_dtype_count_their_product(op: str) -> None:
    """Liger-Kernel's fused cross-entropy accumulates with ``addmm(..., out_dtype=...)``: its
    overload passes `out_dtype` positionally, which torch 2.11's addmm formula refused."""
    from lmscope.measure.flop_count import AttentionAwareCounter

    m, k, n, batch = 5, 7, 3, 2
    shapes = {"addmm": [(m, n), (m, k), (k, n)], "baddbmm": [(batch, m, n), (batch, m, k), (batch, k, n)],
              "mm": [(m, k), (k, n)], "bmm": [(batch, m, k), (batch, k, n)]}[op]
    tensors = [torch.empty(s, device="meta") for s in shapes]
    out = torch.empty(shapes[0] if op in ("addmm", "baddbmm") else (*shapes[0][:-1], n), device="meta")
    counter = AttentionAwareCounter()
    formula = counter.flop_registry[getattr(torch.ops.aten, op)]
    expected = 2 * m * n * k * (batch if op in ("baddbmm", "bmm") else 1)
    assert formula(*tensors, torch.float32, out_val=out) == expected
    assert formula(*tensors, out_val=out) == expected
