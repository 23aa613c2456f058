"""benchmarks/fast/run_strongest_peers.sh: every model once per round, in order, within its budget."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "fast" / "run_strongest_peers.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(tmp_path: Path, budget_s: int, **extra: str) -> str:
    """The script with python3 standing in as a stub that logs its arguments (and summarize.py)."""
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls.txt"
    (stub / "python3").write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    (stub / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
           "BUDGET_S": str(budget_s), "ROUNDS": "2", **extra}
    subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, check=True,
                   timeout=60)
    return calls.read_text()


def test_each_round_runs_fast_eager_every_compile_mode_and_hf(tmp_path: Path) -> None:
    benches = [line for line in run(tmp_path, 470).splitlines() if line.startswith("-m lmscope bench")]
    assert len(benches) == 10
    for index, line in enumerate(benches):
        assert f"--round {index // 5}" in line and "--rounds 2" in line and "--size xl" in line
        assert "--timeout 240" in line and "--resume" in line
    assert "--fast on" in benches[0] and "--peer hf" in benches[3] and "--compile" not in benches[3]
    every_mode = "--compile on,reduce-overhead,max-autotune-no-cudagraphs --compile-scope blocks"
    assert every_mode in benches[2]
    assert "--peer hf" in benches[4] and every_mode in benches[4]


def test_a_spent_budget_skips_the_points_and_still_summarizes(tmp_path: Path) -> None:
    calls = run(tmp_path, 10).splitlines()
    assert not [line for line in calls if "lmscope bench" in line]
    assert any("benchmarks/fast/summarize.py" in line for line in calls)
    assert "skipped, the budget is spent" in (tmp_path / "out" / "log.txt").read_text()


def test_first_round_adds_the_later_rounds_only(tmp_path: Path) -> None:
    benches = [line for line in run(tmp_path, 470, ROUNDS="3", FIRST_ROUND="2").splitlines()
               if line.startswith("-m lmscope bench")]
    assert len(benches) == 5
    assert all("--round 2" in line and "--rounds 3" in line for line in benches)
