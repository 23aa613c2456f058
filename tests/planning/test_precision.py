"""Accumulation in low precision and the dtypes autocast gives each tensor."""

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmscope.planning.precision import accumulate, autocast_dtypes


def by_variant(records):
    return {(r["accumulator"], r["addend"], r["cast"]): r for r in records}


def test_study_numbers_for_a_thousand_hundredths():
    rows = by_variant(accumulate(1000, 0.01))
    assert rows[("fp16", "fp16", "none")]["result"] == 9.953125
    assert abs(rows[("fp32", "fp32", "none")]["result"] - 10) < 1e-3
    implicit = rows[("fp32", "fp16", "implicit")]["result"]
    assert implicit == rows[("fp32", "fp16", "explicit")]["result"]
    # the error is fp16's rounding of 0.01, times 1000 (float64 reference)
    assert implicit == pytest.approx(1000 * float(np.float16(0.01)), abs=1e-4)
    assert rows[("fp16", "fp16", "none")]["exact"] == 10.0


def test_low_precision_sum_matches_a_numpy_reference_and_stalls():
    rng = random.Random()
    value, count = rng.uniform(1e-3, 5e-2), rng.randrange(501, 3001, 2)
    rows = by_variant(accumulate(count, value))
    for dtype, np_dtype in (("fp16", np.float16), ("fp32", np.float32)):
        total, addend = np_dtype(0), np_dtype(value)
        for _ in range(count):
            total = np_dtype(total + addend)
        assert rows[(dtype, dtype, "none")]["result"] == float(total)
    bf16 = rows[("bf16", "bf16", "none")]
    stalled = torch.tensor(bf16["result"], dtype=torch.bfloat16)
    # bf16 stops growing far below the exact sum: one more add changes nothing (half a spacing or less)
    assert bf16["abs_error"] > 0.05 * bf16["exact"]
    assert (stalled + torch.tensor(value, dtype=torch.bfloat16)).item() == bf16["result"]
    assert bf16["addend_as_stored"] <= bf16["spacing_at_result"] / 2


@pytest.mark.parametrize(("count", "value"), [(0, 0.01), (-3, 0.01), (10, float("nan"))])
def test_bad_inputs(count, value):
    with pytest.raises(ValueError):
        accumulate(count, value)


def rows_of(records, kind):
    return {r["name"]: r["dtype"] for r in records if r["kind"] == kind}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_toy_model_under_cpu_autocast(dtype):
    records = autocast_dtypes("toy", dtype, "cpu")
    assert set(rows_of(records, "parameter (inside autocast)").values()) == {"fp32"}
    outputs = rows_of(records, "output")
    assert outputs["fc1"] == outputs["relu"] == outputs["fc2"] == dtype
    assert outputs["logits (model output)"] == dtype
    assert rows_of(records, "loss") == {"cross_entropy": "fp32"}
    assert rows_of(records, "gradient") == dict.fromkeys(["fc1.weight", "ln.weight", "ln.bias", "fc2.weight"],
                                                         "fp32")
    # the layer norm row reports what CPU autocast really does to a layer norm of a low-precision input
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    with torch.autocast("cpu", dtype=low):
        direct = F.layer_norm(torch.randn(3, 10, dtype=low), (10,), torch.ones(10), torch.zeros(10)).dtype
    assert outputs["ln"] == {torch.float32: "fp32", low: dtype}[direct]


def test_transformer_under_autocast_lists_first_block_only():
    records = autocast_dtypes("tiny", "bf16", "cpu")
    outputs = rows_of(records, "output")
    assert outputs["lm_head"] == outputs["layers.0.ffn.w1"] == outputs["layers.0.attn.q_proj"] == "bf16"
    assert outputs["layers.0.ln1"] == "fp32"  # RMSNorm computes in fp32 and returns the fp32 residual's dtype
    assert not any(name.startswith("layers.1") for name in outputs)
    grads = rows_of(records, "gradient")
    assert "lm_head.weight" in grads and set(grads.values()) == {"fp32"}


def test_unknown_autocast_dtype():
    with pytest.raises(ValueError, match="unknown autocast dtype"):
        autocast_dtypes("toy", "fp8", "cpu")


def test_toy_model_under_cuda_fp16_autocast_on_fake_tensors(monkeypatch):
    """CUDA autocast's dtypes without a GPU: the toy model built on fake CUDA tensors. torch turns
    CUDA autocast off where it finds no device (told otherwise here), and the autograd engine
    cannot run a backward on fake CUDA tensors without one (skipped: no gradient rows)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(torch.cuda.amp.common, "amp_definitely_not_available", lambda: False)
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *args, **kwargs: None)
    with FakeTensorMode():
        records = autocast_dtypes("toy", "fp16", "cuda")
    assert {r["device"] for r in records} == {"cuda"}
    assert set(rows_of(records, "parameter (inside autocast)").values()) == {"fp32"}
    outputs = rows_of(records, "output")
    assert outputs["fc1"] == outputs["relu"] == outputs["fc2"] == outputs["logits (model output)"] == "fp16"
    assert outputs["ln"] == "fp32"  # CUDA autocast runs layer_norm in fp32
    assert rows_of(records, "loss") == {"cross_entropy": "fp32"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_toy_model_under_cuda_fp16_autocast():
    """On the device, with the backward: the fake-tensor test's dtypes, and fp32 gradients."""
    records = autocast_dtypes("toy", "fp16", "cuda")
    outputs = rows_of(records, "output")
    assert outputs["fc1"] == "fp16" and outputs["fc2"] == "fp16"
    assert outputs["ln"] == "fp32"  # CUDA autocast runs layer_norm in fp32
    assert rows_of(records, "gradient") == dict.fromkeys(["fc1.weight", "ln.weight", "ln.bias", "fc2.weight"],
                                                         "fp32")


def test_cli_accumulate_json(capsys):
    import json

    from lmscope.cli import main

    main(["precision", "accumulate", "--count", "1000,10", "--format", "json"])
    rows = json.loads(capsys.readouterr().out)["sections"]["accumulation"]
    assert {r["count"] for r in rows} == {1000, 10}
    fp16 = [r for r in rows if r["count"] == 1000 and r["accumulator"] == "fp16"]
    assert fp16[0]["result"] == 9.953125


def test_cli_autocast_table(capsys):
    from lmscope.cli import main

    main(["precision", "autocast", "--model", "toy", "--dtype", "bf16", "--device", "cpu"])
    out = capsys.readouterr().out
    assert "toy under bf16 autocast on cpu" in out and "cross_entropy" in out
