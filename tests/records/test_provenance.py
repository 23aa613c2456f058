"""Provenance that cannot lie: lmscope's own sha, -dirty, a declared override, hosts, GPU facts."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lmscope
from lmscope.records import provenance as prov
from lmscope.workloads.train_step import device_facts

PACKAGE = Path(lmscope.__file__).resolve().parent


def git(cwd, *args):
    command = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *args]
    return subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def new_repo(root: Path, project: str) -> Path:
    """A git repository at `root` with a pyproject naming `project` and one commit."""
    root.mkdir(parents=True)
    git(root, "init", "-q")
    (root / "pyproject.toml").write_text(f'[project]\nname = "{project}"\nversion = "9.9"\n')
    (root / "README.md").write_text("another project\n")
    git(root, "add", ".")
    git(root, "commit", "-qm", "first")
    return root


def copy_package(root: Path) -> Path:
    target = root / "src" / "lmscope"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


@pytest.mark.parametrize("committed", [False, True])
def test_a_copy_inside_another_repository_records_none_of_its_sha(tmp_path, committed):
    other = new_repo(tmp_path / "other", "someone-else")
    copy_package(other)
    if committed:
        git(other, "add", ".")
        git(other, "commit", "-qm", "vendor lmscope")
    their_sha = git(other, "rev-parse", "HEAD")
    script = ("import json, lmscope; from lmscope.records.provenance import source_identity; "
              "print(json.dumps({'file': lmscope.__file__, **source_identity()}))")
    env = {**os.environ, "PYTHONPATH": str(other / "src")}
    env.pop("LMSCOPE_GIT_SHA", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=other, env=env, capture_output=True,
                          text=True, timeout=120, check=True)
    found = json.loads(done.stdout)
    assert Path(found["file"]).resolve().is_relative_to(other.resolve())  # the copy ran
    assert found["git_sha"] is None and found["source"] == "copy"
    assert their_sha[:12] not in done.stdout
    assert found["lmscope_version"] == lmscope.__version__
    assert found["source_hash"] == prov.source_hash(PACKAGE)  # same code, same hash


@pytest.fixture
def lmscope_repo(tmp_path):
    """A small checkout shaped like lmscope's: pyproject 'lmscope', tracked src/lmscope."""
    root = tmp_path / "lmscope"
    root.mkdir()
    git(root, "init", "-q")
    (root / "pyproject.toml").write_text('[project]\nname = "lmscope"\nversion = "0.1.0"\n')
    package = root / "src" / "lmscope"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.1.0"\n')
    (package / "timer.py").write_text("STEPS = 10\n")
    (root / ".gitignore").write_text("runs/\n")
    git(root, "add", ".")
    git(root, "commit", "-qm", "first")
    return root


def test_a_clean_checkout_records_its_commit(lmscope_repo):
    package = (lmscope_repo / "src" / "lmscope").resolve()
    assert prov.git_state(package) == git(lmscope_repo, "rev-parse", "--short=12", "HEAD")


def test_a_changed_tracked_file_makes_the_sha_dirty(lmscope_repo):
    package = (lmscope_repo / "src" / "lmscope").resolve()
    sha = git(lmscope_repo, "rev-parse", "--short=12", "HEAD")
    (package / "timer.py").write_text("STEPS = 11\n")
    assert prov.git_state(package) == f"{sha}-dirty"
    git(lmscope_repo, "checkout", "--", "src/lmscope/timer.py")
    (lmscope_repo / "pyproject.toml").write_text('[project]\nname = "lmscope"\nversion = "0.2.0"\n')
    assert prov.git_state(package) == f"{sha}-dirty"  # any tracked file of the tree counts


def test_untracked_code_under_src_is_dirty_other_untracked_files_are_not(lmscope_repo):
    package = (lmscope_repo / "src" / "lmscope").resolve()
    sha = git(lmscope_repo, "rev-parse", "--short=12", "HEAD")
    (lmscope_repo / "notes.txt").write_text("scratch\n")
    (lmscope_repo / "runs").mkdir()
    (lmscope_repo / "runs" / "results.jsonl").write_text("{}\n")
    assert prov.git_state(package) == sha
    (package / "extra.py").write_text("import os\n")
    assert prov.git_state(package) == f"{sha}-dirty"


def test_a_package_not_at_the_checkouts_src_lmscope_is_not_its_checkout(lmscope_repo, tmp_path):
    assert prov.is_lmscope_checkout(lmscope_repo.resolve(), (lmscope_repo / "src" / "lmscope").resolve())
    moved = lmscope_repo / "vendor" / "lmscope"
    assert not prov.is_lmscope_checkout(lmscope_repo.resolve(), moved.resolve())
    other = new_repo(tmp_path / "other", "lmscope-fork-notes")
    assert not prov.is_lmscope_checkout(other.resolve(), (other / "src" / "lmscope").resolve())


def test_the_sha_is_not_read_from_the_working_directory(lmscope_repo, monkeypatch):
    monkeypatch.chdir(lmscope_repo)
    assert prov.git_state(PACKAGE) != git(lmscope_repo, "rev-parse", "--short=12", "HEAD")


def test_an_override_is_recorded_beside_the_detected_sha(monkeypatch):
    monkeypatch.setenv("LMSCOPE_GIT_SHA", "0123456789ab")
    found = prov.source_identity()
    assert found["git_sha_declared"] == "0123456789ab"
    assert found["git_sha"] == prov.git_state(PACKAGE) != "0123456789ab"
    monkeypatch.delenv("LMSCOPE_GIT_SHA")
    assert prov.source_identity()["git_sha_declared"] is None


def test_two_hosts_with_one_hostname_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(prov.socket, "gethostname", lambda: "vm")
    ids = {}
    for name, machine in (("a", "4f1c0e2d9a7b"), ("b", "88aa00cc11ee"), ("a-again", "4f1c0e2d9a7b")):
        path = tmp_path / f"machine-id-{name}"
        path.write_text(machine + "\n")
        monkeypatch.setattr(prov, "MACHINE_ID_FILES", (path,))
        ids[name] = prov.host_identity()
    assert ids["a"]["host"] == ids["b"]["host"] == "vm"
    assert ids["a"]["host_id"] != ids["b"]["host_id"]
    assert ids["a"]["host_id"] == ids["a-again"]["host_id"] and len(ids["a"]["host_id"]) == 12


def test_without_a_machine_id_the_boot_id_tells_hosts_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(prov.socket, "gethostname", lambda: "vm")
    monkeypatch.setattr(prov, "MACHINE_ID_FILES", (tmp_path / "absent",))
    found = []
    for boot in ("boot-one", "boot-two"):
        path = tmp_path / boot
        path.write_text(boot)
        monkeypatch.setattr(prov, "BOOT_ID_FILE", path)
        found.append(prov.host_identity())
    assert found[0]["host_id"] != found[1]["host_id"]
    assert found[0]["boot_id"] != found[1]["boot_id"]


@pytest.fixture
def fresh_gpu_query(monkeypatch):
    monkeypatch.setattr(prov, "_nvidia_smi_failed", False)


def test_without_nvidia_smi_the_gpu_fields_are_none(tmp_path, monkeypatch, fresh_gpu_query):
    prov.source_identity()  # read with git on PATH (it is cached for the process)
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    assert prov.gpu_state() == dict.fromkeys(prov.GPU_FIELDS)
    row = prov.provenance()
    assert row["gpu_uuid"] is None and row["gpu_sm_clock_mhz"] is None and row["gpu_power_limit_w"] is None
    assert row["device_name"] == row["cpu_model"] == prov.cpu_model()  # the CPU's name instead
    assert prov._nvidia_smi_failed  # not asked again for every row


def test_a_cpu_row_names_the_cpu_model_not_the_architecture(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)  "
                       "Platinum 8480+\nflags\t\t: fpu\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) "
                       "Platinum 8480+\n")
    assert prov.cpu_model(cpuinfo) == "Intel(R) Xeon(R) Platinum 8480+"
    assert prov.cpu_model(tmp_path / "missing") == (prov.platform.processor() or prov.platform.machine())
    monkeypatch.setattr(prov, "CPUINFO_FILE", cpuinfo)
    monkeypatch.setattr(prov, "gpu_state", lambda device=None: dict.fromkeys(prov.GPU_FIELDS))
    row = prov.provenance("cpu")
    assert row["device_name"] == row["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    # a point's own facts, which a row writes over provenance's, name the same CPU
    assert device_facts(torch.device("cpu")) == {"device_type": "cpu",
                                                 "device_name": "Intel(R) Xeon(R) Platinum 8480+"}


def test_gpu_facts_come_from_nvidia_smi_for_the_points_gpu(tmp_path, monkeypatch, fresh_gpu_query):
    log = tmp_path / "args"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f'#!/bin/sh\necho "$@" > {log}\n'
                    'echo "NVIDIA H100 80GB HBM3, 570.86.15, GPU-5d0f, 1755, 2619, 1980, 2619, 700.00"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    gpu = prov.gpu_state("cuda:1")
    assert "--id=1" in log.read_text() and "clocks.max.sm" in log.read_text()
    assert gpu == {"device_name": "NVIDIA H100 80GB HBM3", "driver": "570.86.15", "gpu_uuid": "GPU-5d0f",
                   "gpu_sm_clock_mhz": 1755, "gpu_mem_clock_mhz": 2619, "gpu_sm_clock_max_mhz": 1980,
                   "gpu_mem_clock_max_mhz": 2619, "gpu_power_limit_w": 700.0}
    prov.gpu_state("auto")
    assert "--id=3" in log.read_text()
    log.unlink()
    assert prov.gpu_state("cpu") == dict.fromkeys(prov.GPU_FIELDS)  # a CPU point used no GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert prov.gpu_state("auto") == dict.fromkeys(prov.GPU_FIELDS)
    assert not log.exists()


def test_unsupported_gpu_fields_are_none(tmp_path, monkeypatch, fresh_gpu_query):
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\necho "Some GPU, 1.0, GPU-1, [N/A], [N/A], 1500, [N/A], [Not Supported]"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    gpu = prov.gpu_state()
    assert gpu["gpu_uuid"] == "GPU-1" and gpu["gpu_sm_clock_max_mhz"] == 1500
    assert gpu["gpu_sm_clock_mhz"] is None and gpu["gpu_power_limit_w"] is None


def test_process_state_records_affinity_and_load():
    state = prov.process_state()
    assert state["cpu_affinity_count"] == len(os.sched_getaffinity(0))
    assert state["load_1m"] == pytest.approx(os.getloadavg()[0], abs=5.0)
    assert prov._ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8" and prov._ranges([4]) == "4"


def test_stamp_puts_provenance_under_a_rows_own_keys():
    row = prov.stamp({"impl": "flash", "median_ms": 1.5, "time": "kept"})
    assert row["impl"] == "flash" and row["time"] == "kept"
    assert {"host_id", "git_sha", "git_sha_declared", "gpu_uuid", "cpu_affinity", "torch"} <= set(row)


def test_a_reports_source_label_says_when_a_sha_was_only_declared():
    assert prov.source_label({"git_sha": "0123456789ab-dirty"}) == "0123456789ab-dirty"
    declared = {"git_sha": None, "git_sha_declared": "feedbeef", "source_hash": "abc123def456"}
    assert prov.source_label(declared) == "feedbeef (declared, source abc123def456)"
    installed = {"lmscope_version": "0.1.0", "source": "installed"}
    assert prov.source_label(installed) == "lmscope 0.1.0 (installed)"
    assert prov.source_label({}) == "unknown"


def test_an_installed_package_records_its_version_and_no_sha(tmp_path, monkeypatch):
    site = tmp_path / "site-packages"
    package = copy_package(site.parent / "unused").resolve()
    installed = site / "lmscope"
    shutil.move(str(package), installed)

    class Distribution:
        version = "7.7.7"

        def locate_file(self, path):
            return site / path

    monkeypatch.setattr(prov.metadata, "distribution", lambda name: Distribution())
    found = prov.source_identity(installed.resolve())
    assert found["source"] == "installed" and found["lmscope_version"] == "7.7.7"
    assert found["git_sha"] is None


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi")
def test_a_real_gpu_row_names_its_uuid_clocks_and_power_limit(fresh_gpu_query):
    row = prov.provenance("cuda:0")
    assert row["gpu_uuid"].startswith(("GPU-", "MIG-")) and row["driver"]
    assert row["gpu_sm_clock_max_mhz"] >= row["gpu_sm_clock_mhz"] > 0
    assert row["gpu_mem_clock_max_mhz"] > 0 and row["gpu_power_limit_w"] > 0


def test_kernel_env_names_the_flash_variant_set(monkeypatch):
    for name in [k for k in os.environ if k.startswith(prov.KERNEL_ENV_PREFIX)]:
        monkeypatch.delenv(name)
    assert prov.kernel_env() is None
    monkeypatch.setenv("LMSCOPE_FLASH_DQ", "atomic")
    monkeypatch.setenv("LMSCOPE_FLASH_WIDE", "1")
    monkeypatch.setenv("LMSCOPE_GIT_SHA", "abc")
    assert prov.kernel_env() == {"LMSCOPE_FLASH_DQ": "atomic", "LMSCOPE_FLASH_WIDE": "1"}


def test_source_hash_covers_the_cpp_the_package_builds(tmp_path):
    """A change to a .cpp file (FlashAttention's C++ host path) changes the hash; a package with
    no .cpp hashes its .py files as before the .cpp counted."""
    (tmp_path / "pkg" / "csrc").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    before = prov.source_hash(tmp_path / "pkg")
    digest = hashlib.sha256(b"a.py\0" + b"x = 1\n\0").hexdigest()[:12]
    assert before == digest
    (tmp_path / "pkg" / "csrc" / "k.cpp").write_text("int f() { return 1; }\n")
    with_cpp = prov.source_hash(tmp_path / "pkg")
    (tmp_path / "pkg" / "csrc" / "k.cpp").write_text("int f() { return 2; }\n")
    assert len({before, with_cpp, prov.source_hash(tmp_path / "pkg")}) == 3
