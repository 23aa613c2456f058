"""What the study runs on: the device type, how many GPUs and the device's name.

Given as parameters (tests pretend a GPU box without CUDA) or detected from torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Target:
    """The machine a study is planned for."""

    device_type: str = "cpu"
    """cpu | cuda."""
    gpus: int = 0
    """CUDA devices visible (0 on a CPU)."""
    device_name: str = "cpu"
    """The device's name, as provenance shows it."""

    def __post_init__(self) -> None:
        if self.device_type not in ("cpu", "cuda"):
            raise ValueError(f"device type must be cpu or cuda, got {self.device_type!r}")
        if self.device_type == "cuda" and self.gpus < 1:
            raise ValueError("a cuda target needs at least one GPU")

    @property
    def on_gpu(self) -> bool:
        """Whether the study runs the GPU plan."""
        return self.device_type == "cuda"


def detect(device: str = "auto") -> Target:
    """The target of `--device` (auto: cuda when a GPU is visible, else cpu)."""
    import torch

    from lmscope.records.results import provenance  # nvidia-smi's name: no CUDA context in this process

    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(
            f"--device takes auto, cpu or cuda, got {device!r} (choose a GPU with CUDA_VISIBLE_DEVICES)"
        )
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return Target()
    if not torch.cuda.is_available():
        raise ValueError(f"--device {device} but no CUDA device is visible: use --device cpu")
    return Target(
        device_type="cuda", gpus=torch.cuda.device_count(), device_name=provenance()["device_name"]
    )
