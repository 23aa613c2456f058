"""benchmarks/distributed/run_8b_ablation.sh: FSDP_STRATEGY and ATTENTION reach the planner, every
row, the profile and plans.json (python3 stubbed: it logs the commands and answers the planner)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "distributed" / "run_8b_ablation.sh"
PLANNED = "blocks:0-4+selective:5-9"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(tmp_path: Path, **extra: str) -> tuple[list[str], list[dict]]:
    """The commands the script ran and the plans it recorded."""
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls.txt"
    plan = json.dumps({"sections": {"chosen": [{"policy": PLANNED}]}})
    (stub / "python3").write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\n'
        f'echo "$*" >> {calls}\n'
        f"if [[ \"$*\" == *'plan checkpoint'* ]]; then echo '{plan}'; fi\n")
    (stub / "python3").chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "OUT": str(out), **extra}
    subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, check=True,
                   timeout=60)
    plans = [json.loads(line) for line in (out / "plans.json").read_text().splitlines()]
    return calls.read_text().splitlines(), plans


def test_the_variant_and_the_attention_reach_every_command(tmp_path: Path) -> None:
    calls, plans = run(tmp_path, STAGES="c,p", ROWS="selective best", ATTENTION="sdpa-cudnn",
                       FSDP_STRATEGY="fsdp:separate-reduce", OPTIMIZER_STATE="host")
    rows = [line for line in calls if "-m lmscope ddp" in line]
    planner = [line for line in calls if "plan checkpoint" in line]
    profile = [line for line in calls if "profile_fsdp_step.py" in line]
    assert len(rows) == 2 and len(profile) == 1 and planner
    for line in rows + profile:
        assert "--attention sdpa-cudnn" in line and "--strategy fsdp:separate-reduce" in line
        assert f"--checkpoint {PLANNED}" in line and "--optimizer-state host" in line
    assert all("--attention sdpa-cudnn" in line and "--optimizer-state host" in line for line in planner)
    assert [(p["row"], p["strategy"], p["attention"], p["optimizer_state"]) for p in plans] == [
        ("selective", "fsdp:separate-reduce", "sdpa-cudnn", "host"),
        ("best", "fsdp:separate-reduce", "sdpa-cudnn", "host")]


def test_the_defaults_are_lmscope_fsdp_and_its_flash_attention(tmp_path: Path) -> None:
    calls, plans = run(tmp_path, STAGES="c", ROWS="full")
    (row,) = [line for line in calls if "-m lmscope ddp" in line]
    assert "--attention flash" in row and "--strategy fsdp " in row and "--checkpoint block " in row
    assert "--optimizer-state device" in row
    assert plans == [{"row": "full", "checkpoint": "block", "stage": "c", "strategy": "fsdp",
                      "attention": "flash", "optimizer_state": "device"}]
