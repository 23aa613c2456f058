"""Energy per step from NVML's total-energy counter (NVIDIA GPUs; `pip install 'lmscope[energy]'`).

`nvmlDeviceGetTotalEnergyConsumption` returns the millijoules the GPU used since the driver
loaded, but the value only moves when the driver refreshes it (about every 100 ms on an H100),
far less often than a short step ends. So energy is not read around each step: a poller thread
reads the counter every millisecond while the step runs back to back, and the energy is taken
between two counter *updates* (the first and the last seen inside the loop), whose instants are
known to within the poll gap around each. The loop runs until that window holds `min_updates`
updates and lasts `min_window_s`; the row's `energy_error` is the window's time uncertainty
over its length (the mJ resolution adds next to nothing), and `energy_exact` is false, with
`energy_reason`, when the error bound exceeds `tolerance` or the loop hit `max_s` first.
Average power over the window times the loop's mean step time gives the joules per step.
The GPU's whole draw is counted (other processes on it included).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lmscope.measure.timer import synchronize

EnergyCounter = Callable[[], int]
"""Reads the device's total energy in millijoules."""

KEYS = ("joules_per_step", "avg_watts", "joules_per_token", "energy_window_s", "energy_updates",
        "energy_update_ms", "energy_error", "energy_exact", "energy_reason")


def unavailable(reason: str) -> dict[str, Any]:
    """The energy fields of a row where energy was not measured, with why."""
    return {**dict.fromkeys(KEYS), "energy_exact": False, "energy_reason": reason}


def nvml_energy_counter(device: torch.device) -> tuple[EnergyCounter | None, str | None]:
    """(counter, None) for a CUDA device whose NVML exposes the energy counter, else (None, why)."""
    if device.type != "cuda":
        return None, "energy is read from NVML on NVIDIA GPUs only"
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed: pip install 'lmscope[energy]'"
    try:
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        handle = pynvml.nvmlDeviceGetHandleByUUID(name)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except pynvml.NVMLError as error:
        return None, f"NVML has no energy counter for this GPU: {error}"
    return (lambda: int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))), None


@dataclass(frozen=True)
class Update:
    """A change of the counter, seen at `seen` and not at the read before (`before`)."""

    before: float
    seen: float
    millijoules: int

    @property
    def at(self) -> float:
        """Best estimate of the update's instant: the middle of its bracket."""
        return (self.before + self.seen) / 2

    @property
    def half_width(self) -> float:
        return (self.seen - self.before) / 2


class _Poller(threading.Thread):
    """Reads the counter every `poll_s` and keeps each change with the read before it."""

    def __init__(self, counter: EnergyCounter, poll_s: float) -> None:
        super().__init__(daemon=True)
        self._counter, self._poll_s = counter, poll_s
        self._halt = threading.Event()
        self.updates: list[Update] = []

    def run(self) -> None:
        last_t, last = time.perf_counter(), self._counter()
        while not self._halt.is_set():
            time.sleep(self._poll_s)
            now, value = time.perf_counter(), self._counter()
            if value != last:
                self.updates.append(Update(last_t, now, value))
            last_t, last = now, value

    def stop(self) -> None:
        self._halt.set()
        self.join()


def measure_energy(
    run_step: Callable[[], Any],
    *,
    device: torch.device,
    counter: EnergyCounter,
    tokens_per_step: int,
    min_window_s: float = 2.0,
    min_updates: int = 10,
    tolerance: float = 0.01,
    max_s: float = 30.0,
    poll_s: float = 0.001,
) -> dict[str, Any]:
    """Run `run_step` back to back (synchronized, untimed) until the window is long enough; the row.

    Call it after the timed steps: it runs extra steps of its own, never inside timed ones.
    """
    poller = _Poller(counter, poll_s)
    poller.start()
    synchronize(device)
    begin = time.perf_counter()
    steps = 0
    try:
        while True:
            run_step()
            synchronize(device)
            steps += 1
            now = time.perf_counter()
            inside = [u for u in poller.updates if u.before >= begin]
            long_enough = len(inside) > min_updates and inside[-1].at - inside[0].at >= min_window_s
            if long_enough or now - begin >= max_s:
                break
    finally:
        poller.stop()
    end = now
    inside = [u for u in poller.updates if u.before >= begin and u.seen <= end]
    if len(inside) < 2:
        return unavailable(f"the energy counter updated {len(inside)} times in {end - begin:.2f} s "
                           "of steps: too few to measure between updates")
    first, last = inside[0], inside[-1]
    window_s = last.at - first.at
    joules = (last.millijoules - first.millijoules) / 1e3
    watts = joules / window_s
    periods = [b.at - a.at for a, b in zip(inside, inside[1:], strict=False)]
    error = (first.half_width + last.half_width) / window_s + 1e-3 / max(joules, 1e-3)
    per_step = watts * (end - begin) / steps
    reasons = []
    if len(inside) <= min_updates or window_s < min_window_s:
        reasons.append(f"the loop stopped at {max_s:g} s with {len(inside) - 1} counter periods "
                       f"over {window_s:.2f} s (wanted {min_updates} over {min_window_s:g} s)")
    if error > tolerance:
        reasons.append(f"the window's error bound {error:.2%} exceeds {tolerance:.0%}")
    return {
        "joules_per_step": per_step,
        "avg_watts": watts,
        "joules_per_token": per_step / tokens_per_step,
        "energy_window_s": window_s,
        "energy_updates": len(inside) - 1,
        "energy_update_ms": 1e3 * statistics.median(periods),
        "energy_error": error,
        "energy_exact": not reasons,
        "energy_reason": "; ".join(reasons) or None,
    }


def step_energy(run_step: Callable[[], Any], *, device: torch.device, tokens_per_step: int,
                **window: Any) -> dict[str, Any]:
    """`measure_energy` with the device's NVML counter, or the fields as None with the reason."""
    counter, reason = nvml_energy_counter(device)
    if counter is None:
        return unavailable(reason or "no energy counter")
    return measure_energy(run_step, device=device, counter=counter, tokens_per_step=tokens_per_step,
                          **window)
