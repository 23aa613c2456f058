"""Provenance: where, on what and from which source a row was produced, read so it cannot lie.

- **Source.** `git_sha` is the commit of the tree lmscope was imported from, and only when that
  tree is lmscope's own checkout (its toplevel holds lmscope's pyproject and tracks this package):
  a copy of the source inside another repository records no sha of that repository. It ends in
  `-dirty` when tracked files differ from the commit or untracked files sit under `src/` (they
  change what runs). `source` says which case it was (`git`, `installed`, `copy`);
  `lmscope_version` is the package's version; `source_hash` hashes the package's source files
  (`SOURCE_GLOBS`: .py, and the .cpp that FlashAttention's C++ host path builds from; rows
  written before that commit of 2026-11-26 hashed the .py files only), so a copy without .git can
  still be checked against a commit. `LMSCOPE_GIT_SHA` is recorded as
  `git_sha_declared`, beside the detected value, never instead of it.
- **Host.** `host` (the hostname) and `host_id`, a short hash of the hostname and the machine id
  (the boot id where there is none), so two machines with one hostname are told apart; `boot_id`
  is a short hash of the boot.
- **GPU.** From nvidia-smi when it answers (all None on a machine without it): name, driver,
  UUID, current and maximum SM and memory clocks (MHz, read when the row is written, just after
  the point ran) and the power limit (W).
- **Process.** Its CPU affinity (count and list) and the machine's load averages.
- **Kernel variants.** `kernel_env`: the `LMSCOPE_FLASH_*` environment variables that pick a
  FlashAttention variant (dQ mode, config lists, split head dims, the C++ host path, the Gluon
  kernels on Hopper), name to value; None where none is set. Which host path a timed call took
  is the attention rows' `autograd_node`, which kernels ran their `flash_kernels`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import platform
import re
import socket
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).resolve().parent.parent
SHA_ENV = "LMSCOPE_GIT_SHA"
KERNEL_ENV_PREFIX = "LMSCOPE_FLASH_"
MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
CPUINFO_FILE = Path("/proc/cpuinfo")
GPU_FIELDS = {
    "device_name": "name",
    "driver": "driver_version",
    "gpu_uuid": "uuid",
    "gpu_sm_clock_mhz": "clocks.sm",
    "gpu_mem_clock_mhz": "clocks.mem",
    "gpu_sm_clock_max_mhz": "clocks.max.sm",
    "gpu_mem_clock_max_mhz": "clocks.max.mem",
    "gpu_power_limit_w": "power.limit",
}
"""Row key -> nvidia-smi --query-gpu field."""


def _git(args: list[str], cwd: Path) -> str | None:
    """stdout of a git command, or None when git is missing or the command fails."""
    try:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def is_lmscope_checkout(toplevel: Path, package_dir: Path) -> bool:
    """Whether `toplevel` is lmscope's own repository and this package is its tracked src/lmscope."""
    if package_dir != toplevel / "src" / "lmscope":
        return False
    try:
        pyproject = (toplevel / "pyproject.toml").read_text(encoding="utf-8")
    except OSError:
        return False
    if not re.search(r'(?m)^name\s*=\s*"lmscope"\s*$', pyproject):
        return False
    return _git(["ls-files", "--error-unmatch", "src/lmscope/__init__.py"], toplevel) is not None


def git_state(package_dir: Path = PACKAGE_DIR) -> str | None:
    """'<sha12>' or '<sha12>-dirty' of lmscope's checkout holding `package_dir`; None otherwise."""
    top = _git(["rev-parse", "--show-toplevel"], package_dir)
    if not top or not is_lmscope_checkout(Path(top).resolve(), package_dir.resolve()):
        return None
    toplevel = Path(top).resolve()
    sha = _git(["rev-parse", "--short=12", "HEAD"], toplevel)
    tracked = _git(["status", "--porcelain", "--untracked-files=no"], toplevel)
    untracked = _git(["ls-files", "--others", "--exclude-standard", "--", "src"], toplevel)
    if not sha or tracked is None or untracked is None:
        return None
    return f"{sha}-dirty" if tracked or untracked else sha


SOURCE_GLOBS = ("*.py", "*.cpp")
"""The package's files that decide what runs: its Python, and the C++ it builds at run time."""


def source_hash(package_dir: Path = PACKAGE_DIR) -> str:
    """sha256 (12 hex) of the package's source files (``SOURCE_GLOBS``), by path and content:
    the code that runs. A package with no .cpp file hashes as it did before they counted."""
    digest = hashlib.sha256()
    for path in sorted(p for glob in SOURCE_GLOBS for p in package_dir.rglob(glob)):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _installed_version(package_dir: Path) -> tuple[str | None, bool]:
    """(lmscope's distribution version, whether that distribution's files are this package)."""
    try:
        dist = metadata.distribution("lmscope")
    except metadata.PackageNotFoundError:
        return None, False
    located = Path(str(dist.locate_file("lmscope/__init__.py"))).resolve()
    return dist.version, located == package_dir / "__init__.py"


def source_identity(package_dir: Path = PACKAGE_DIR) -> dict[str, Any]:
    """git_sha, git_sha_declared, source, lmscope_version and source_hash of `package_dir`."""
    return {**_detected_source(package_dir), "git_sha_declared": os.environ.get(SHA_ENV) or None}


@cache
def _detected_source(package_dir: Path) -> dict[str, Any]:
    """What the tree itself says (read once per process: the code that runs does not change)."""
    sha = git_state(package_dir)
    version, installed = _installed_version(package_dir)
    return {
        "git_sha": sha,
        "source": "git" if sha else "installed" if installed else "copy",
        "lmscope_version": version or _package_version(package_dir),
        "source_hash": source_hash(package_dir),
    }


def _package_version(package_dir: Path) -> str | None:
    match = re.search(r'__version__\s*=\s*"([^"]+)"',
                      (package_dir / "__init__.py").read_text(encoding="utf-8"))
    return match.group(1) if match else None


def _short_hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _read_id(paths: tuple[Path, ...]) -> str:
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if text:
            return text
    return ""


def host_identity() -> dict[str, Any]:
    """host, host_id (hostname + machine id, else boot id), boot_id (hashed short) and cpu_model."""
    hostname = socket.gethostname()
    boot = _read_id((BOOT_ID_FILE,))
    machine = _read_id(MACHINE_ID_FILES) or boot
    return {"host": hostname, "host_id": _short_hash(hostname, machine),
            "boot_id": _short_hash(boot) if boot else None, "cpu_model": cpu_model()}


def cpu_model(cpuinfo: Path | None = None) -> str:
    """The CPU's model name (Linux's /proc/cpuinfo 'model name'), else what `platform` knows
    (on Linux that is only the architecture, 'x86_64')."""
    try:
        for line in (cpuinfo or CPUINFO_FILE).read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpu_selector(device: str | None) -> str | None:
    """The nvidia-smi --id of the GPU a point's device names (cuda:N among CUDA_VISIBLE_DEVICES);
    None for a CPU point or when no GPU is visible to the process."""
    if device == "cpu":
        return None
    index = 0
    if device and device.startswith("cuda:") and device[5:].isdigit():
        index = int(device[5:])
    visible_env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible_env is None:
        return str(index)
    visible = [v.strip() for v in visible_env.split(",") if v.strip()]
    if not visible or visible[0].startswith("-"):
        return None
    return visible[index] if index < len(visible) else visible[-1]


_nvidia_smi_failed = False


def _query_gpu(selector: str) -> list[str] | None:
    """One nvidia-smi query of GPU_FIELDS for one GPU; None (and no further tries) when it fails."""
    global _nvidia_smi_failed
    if _nvidia_smi_failed:
        return None
    command = ["nvidia-smi", f"--id={selector}", "--query-gpu=" + ",".join(GPU_FIELDS.values()),
               "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        _nvidia_smi_failed = True
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return None
    values = [value.strip() for value in lines[0].split(",")]
    return values if len(values) == len(GPU_FIELDS) else None


def _gpu_value(key: str, text: str) -> Any:
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return None
    if key in ("device_name", "driver", "gpu_uuid"):
        return text
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() and key != "gpu_power_limit_w" else number


def gpu_state(device: str | None = None) -> dict[str, Any]:
    """Name, driver, UUID, clocks and power limit of the point's GPU (None each without one)."""
    selector = _gpu_selector(device)
    values = None if selector is None else _query_gpu(selector)
    if values is None:
        return dict.fromkeys(GPU_FIELDS)
    return {key: _gpu_value(key, text) for key, text in zip(GPU_FIELDS, values, strict=True)}


def _ranges(cpus: list[int]) -> str:
    """'0-3,8,10-11' for a sorted list of CPU ids."""
    spans: list[list[int]] = []
    for cpu in cpus:
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in spans)


def process_state() -> dict[str, Any]:
    """This process's CPU affinity (count and list) and the machine's 1/5/15-minute load."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = []
    try:
        load: tuple[float, ...] | tuple[None, ...] = tuple(round(x, 2) for x in os.getloadavg())
    except (AttributeError, OSError):
        load = (None, None, None)
    return {"cpu_count": os.cpu_count(), "cpu_affinity_count": len(cpus) or None,
            "cpu_affinity": _ranges(cpus) or None,
            "load_1m": load[0], "load_5m": load[1], "load_15m": load[2]}


def provenance(device: str | None = None) -> dict[str, Any]:
    """Every provenance key of a row; `device` (a point's 'cuda:N') picks the GPU described."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu = gpu_state(device)
    host = host_identity()
    if gpu["device_name"] is None:
        gpu["device_name"] = host["cpu_model"]
    return {
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        **host,
        **gpu,
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        **source_identity(),
        **process_state(),
        "kernel_env": kernel_env(),
    }


def kernel_env() -> dict[str, str] | None:
    """The ``LMSCOPE_FLASH_*`` variables set in this process (they change which kernels run)."""
    found = {k: v for k, v in sorted(os.environ.items()) if k.startswith(KERNEL_ENV_PREFIX)}
    return found or None


def source_label(row: dict[str, Any]) -> str:
    """How a report names the source of a row: the detected sha; a declared sha beside a detected
    one that differs (a copy whose .git is not the tree that ran), with the source hash that
    checks it; else the version."""
    hashed = f", source {row['source_hash']}" if row.get("source_hash") else ""
    detected, declared = row.get("git_sha"), row.get("git_sha_declared")
    if declared and declared != detected:
        seen = f"; detected {detected}" if detected else ""
        return f"{declared} (declared{seen}{hashed})"
    if detected:
        return str(detected)
    version = row.get("lmscope_version")
    return f"lmscope {version} ({row.get('source') or 'unknown source'}{hashed})" if version else "unknown"


def code_identity(row: dict[str, Any]) -> str | None:
    """What identifies the code that wrote a row: its source hash (the package's files, whatever
    git said), else its git sha (rows of older lmscope versions)."""
    return row.get("source_hash") or row.get("git_sha")


def stamp(row: dict[str, Any], device: str | None = None) -> dict[str, Any]:
    """`row` with the provenance in front (a row's own keys win): how scripts write their rows."""
    return {**provenance(device), **row}
