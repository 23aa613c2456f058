"""`lmscope ddp` skips the paired unwrapped step where the memory model says it cannot fit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from lmscope.workloads import unwrapped_fit
from lmscope.workloads.ddp import Spec

GIB = 2**30
LONG_8B = dict(size="small", d_model=4096, d_ff=11008, num_heads=32, vocab_size=151936, num_layers=34,
               context_length=32768, batch_size=1, precision="bf16", attention="flash", fast=True,
               strategy="fsdp")


def _device_of(monkeypatch: pytest.MonkeyPatch, gib: float) -> torch.device:
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(total_memory=int(gib * GIB)))
    return torch.device("cuda", 0)


@pytest.mark.parametrize("checkpoint", ["blocks:0-20", "blocks:0-15+selective:16-32", "none"])
def test_the_8b_long_step_is_skipped_on_an_h200_with_the_reason(monkeypatch, checkpoint):
    spec = Spec(**LONG_8B, checkpoint=checkpoint)
    peak = unwrapped_fit.unwrapped_peak_bytes(spec)
    assert peak > 8e9 * 16  # at least the fp32 weights, gradients and AdamW state of 8B parameters
    why = unwrapped_fit.why_unwrapped_cannot_fit(spec, _device_of(monkeypatch, 139.8))
    assert why is not None and f"{peak / GIB:.1f} GiB" in why and "139.8 GiB" in why


def test_a_step_within_the_margin_still_runs(monkeypatch):
    spec = Spec(size="xl", context_length=512, batch_size=4, precision="bf16", strategy="fsdp")
    peak = unwrapped_fit.unwrapped_peak_bytes(spec)
    assert unwrapped_fit.why_unwrapped_cannot_fit(spec, _device_of(monkeypatch, 139.8)) is None
    # just above the device's memory, inside the margin: the prediction may be off, try it
    assert unwrapped_fit.why_unwrapped_cannot_fit(spec, _device_of(monkeypatch, 1.05 * peak / GIB)) is None
    assert unwrapped_fit.why_unwrapped_cannot_fit(spec, _device_of(monkeypatch, 0.8 * peak / GIB)) is not None


def test_no_prediction_or_no_gpu_means_try_it(monkeypatch):
    spec = Spec(**{**LONG_8B, "fast": False, "attention": "sdpa"}, checkpoint="block")
    assert unwrapped_fit.why_unwrapped_cannot_fit(spec, torch.device("cpu")) is None
    monkeypatch.setattr(Spec, "model_config", lambda self: None)  # a transformers model, a factory
    assert unwrapped_fit.unwrapped_peak_bytes(spec) is None
    assert unwrapped_fit.why_unwrapped_cannot_fit(spec, _device_of(monkeypatch, 1.0)) is None
