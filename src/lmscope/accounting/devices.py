"""Catalog of accelerators: dense peak throughput per dtype, memory, bandwidths.

Numbers are the vendors' datasheet figures for *dense* math (no 2:4 sparsity). A device that is
not in the catalog gets `None`, never a guessed peak. Sources are given per entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """Datasheet figures of one accelerator."""

    name: str
    """Catalog name, e.g. 'H100 SXM'."""
    peak_tflops: dict[str, float] = field(default_factory=dict)
    """Dense peak TFLOP/s by dtype: 'fp32' (no TF32), 'tf32', 'bf16', 'fp16', 'fp8'."""
    hbm_gb: float
    """Device memory in decimal GB, as sold."""
    hbm_gbps: float
    """Device memory bandwidth in decimal GB/s."""
    interconnect_gbps: float
    """Scale-up interconnect bandwidth per device, one direction, decimal GB/s (NVLink, ICI)."""
    source: str
    """Where the figures come from."""
    host_link_gbps: float | None = None
    """Link to host memory (PCIe), one direction, decimal GB/s: half the datasheet's bidirectional
    figure; None where the datasheet gives none. What offloading activations moves over."""
    collective_gbps: float | None = None
    """Bandwidth W that a ring collective over one mesh axis moves per device, decimal GB/s (the W
    of the TPU Scaling Book): NVLink one-way per GPU behind an NVSwitch (= interconnect_gbps, the
    default); on a TPU axis with wraparound, both directions of one ICI link."""

    @property
    def axis_gbps(self) -> float:
        """The collective bandwidth W of one mesh axis (collective_gbps, else interconnect_gbps)."""
        return self.collective_gbps or self.interconnect_gbps

    def peak(self, dtype: str) -> float | None:
        """Dense peak TFLOP/s for `dtype`, or None when the datasheet gives none."""
        return self.peak_tflops.get(dtype)


CATALOG: dict[str, DeviceSpec] = {
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): SXM5 80 GB HBM3, 3.35 TB/s,
    # NVLink 900 GB/s bidirectional; FP32 67, TF32 494.7, BF16/FP16 989.4, FP8 1978.9 TFLOP/s dense.
    "H100 SXM": DeviceSpec(
        name="H100 SXM",
        peak_tflops={"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        hbm_gb=80, hbm_gbps=3350, interconnect_gbps=450, host_link_gbps=64,  # PCIe Gen5: 128 GB/s
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM5), dense figures",
    ),
    # Same datasheet, PCIe card: 80 GB HBM2e 2.0 TB/s, NVLink bridge 600 GB/s bidirectional.
    "H100 PCIe": DeviceSpec(
        name="H100 PCIe",
        peak_tflops={"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
        hbm_gb=80, hbm_gbps=2000, interconnect_gbps=300, host_link_gbps=64,  # PCIe Gen5: 128 GB/s
        source="NVIDIA H100 Tensor Core GPU datasheet (PCIe), dense figures",
    ),
    # NVIDIA H200 datasheet: same compute as H100 SXM, 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
    "H200": DeviceSpec(
        name="H200",
        peak_tflops={"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
        hbm_gb=141, hbm_gbps=4800, interconnect_gbps=450, host_link_gbps=64,  # PCIe Gen5: 128 GB/s
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM), dense figures",
    ),
    # NVIDIA A100 datasheet: 80 GB SXM, 2,039 GB/s, NVLink 600 GB/s bidirectional;
    # FP32 19.5, TF32 156, BF16/FP16 312 TFLOP/s dense.
    "A100": DeviceSpec(
        name="A100",
        peak_tflops={"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
        hbm_gb=80, hbm_gbps=2039, interconnect_gbps=300, host_link_gbps=32,  # PCIe Gen4: 64 GB/s
        source="NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB), dense figures",
    ),
    # NVIDIA HGX B200 figures per GPU: BF16/FP16 2.25 PFLOP/s dense, TF32 1.1, FP8 4.5, FP32 75;
    # 180 GB HBM3e at 7.7 TB/s (HGX); NVLink 5 1.8 TB/s bidirectional.
    "B200": DeviceSpec(
        name="B200",
        peak_tflops={"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
        hbm_gb=180, hbm_gbps=7700, interconnect_gbps=900,
        source="NVIDIA HGX B200 specifications (per GPU), dense figures",
    ),
    # Google Cloud TPU v5p documentation: 459 TFLOP/s bf16, 95 GB HBM2e at 2,765 GB/s,
    # ICI 4,800 Gbps per chip; the TPU Scaling Book ("Training" section) uses 9e10 B/s one-way per
    # ICI link, so W_ici = 2 * 9e10 B/s for a collective along one axis with wraparound.
    "TPU v5p": DeviceSpec(
        name="TPU v5p",
        peak_tflops={"bf16": 459.0, "fp8": 918.0},
        hbm_gb=95, hbm_gbps=2765, interconnect_gbps=90, collective_gbps=180,
        source="Google Cloud TPU v5p system architecture page; TPU Scaling Book (chips part)",
    ),
}


def lookup(device_name: str | None) -> DeviceSpec | None:
    """Catalog entry for a device name as reported by the driver, or None when unknown.

    'NVIDIA H100 80GB HBM3' -> H100 SXM; 'NVIDIA H100 PCIe' -> H100 PCIe; 'NVIDIA H200' -> H200.
    """
    if not device_name:
        return None
    name = device_name.upper()
    if name in (key.upper() for key in CATALOG):
        return next(spec for key, spec in CATALOG.items() if key.upper() == name)
    if "H100" in name and "NVL" not in name:  # H100 NVL (94 GB, other clocks) is not catalogued
        return CATALOG["H100 PCIe" if "PCIE" in name else "H100 SXM"]
    for key in ("H200", "A100", "B200"):
        if key in name:
            return CATALOG[key]
    if "V5P" in name:
        return CATALOG["TPU v5p"]
    return None


def peak_tflops(device_name: str | None, dtype: str) -> float | None:
    """Dense peak TFLOP/s of a named device for `dtype` ('fp32', 'bf16', ...), else None."""
    spec = lookup(device_name)
    return spec.peak(dtype) if spec else None
