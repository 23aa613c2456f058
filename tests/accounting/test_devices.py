"""Device catalog: driver names map to entries; unknown devices give None, never a guess."""

import pytest

from lmscope.accounting.devices import CATALOG, lookup, peak_tflops


@pytest.mark.parametrize(("reported", "entry"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA B200", "B200"),
    ("tpu v5p", "TPU v5p"),
    ("H100 SXM", "H100 SXM"),
])
def test_lookup_maps_driver_names(reported, entry):
    assert lookup(reported) is CATALOG[entry]


@pytest.mark.parametrize("reported", [None, "", "NVIDIA GeForce RTX 4090", "NVIDIA H100 NVL", "x86_64"])
def test_unknown_devices_are_none(reported):
    assert lookup(reported) is None
    assert peak_tflops(reported, "bf16") is None


def test_peaks_and_missing_dtypes():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("A100", "fp32") == 19.5
    assert peak_tflops("TPU v5p", "fp32") is None  # the datasheet gives none: no guess
    assert peak_tflops("A100", "fp8") is None


def test_collective_bandwidth_per_axis():
    assert CATALOG["H100 SXM"].axis_gbps == 450  # NVLink 900 GB/s bidirectional, one way
    assert CATALOG["TPU v5p"].axis_gbps == 180  # Scaling Book: W_ici = 2 * 9e10 B/s


def test_every_entry_is_complete():
    for key, spec in CATALOG.items():
        assert spec.name == key and spec.source
        assert spec.hbm_gb > 0 and spec.hbm_gbps > 0 and spec.interconnect_gbps > 0
        assert spec.peak("bf16") and all(v > 0 for v in spec.peak_tflops.values())
