"""benchmarks/stages.sh: earlier stages keep their time when the selected stages exceed the budget."""

import shutil
import subprocess
from pathlib import Path

import pytest

STAGES_SH = Path(__file__).resolve().parents[1] / "benchmarks" / "stages.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def stage_limits(stages: str, budget_s: int, costs: dict[str, int], reserve_end: int = 0) -> dict[str, int]:
    """Source stages.sh with these stages and return stage_limit of each, asked before any runs."""
    order = " ".join(costs)
    cost = " ".join(f"[{name}]={seconds}" for name, seconds in costs.items())
    script = f"""
        set -u
        STAGES="{stages}"; ORDER=({order}); declare -A COST=({cost}); RESERVE_END={reserve_end}
        deadline=$((SECONDS + {budget_s}))
        source {STAGES_SH}
        for name in {order}; do echo "$name $(stage_limit "$name" 2>/dev/null)"; done
    """
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return {name: int(limit) for name, limit in (line.split() for line in out.splitlines()[1:])}


def assert_limits(got: dict[str, int], expected: dict[str, int]) -> None:
    """`got` equals `expected`, except that a granted limit may be one second lower: bash's
    SECONDS can tick between setting the deadline and reading the clock."""
    assert got.keys() == expected.keys()
    for name, limit in expected.items():
        assert got[name] in ((limit, limit - 1) if limit else (0,)), (name, got, expected)


def test_first_stages_are_not_starved_by_stages_that_do_not_fit() -> None:
    limits = stage_limits("a b c d", 100, {"a": 30, "b": 40, "c": 300, "d": 20})
    # planned: a, b, d (c does not fit); a keeps 100 - 40 - 20, b keeps 100 - 20
    assert_limits(limits, {"a": 40, "b": 80, "c": 80, "d": 100})


def test_unselected_stages_get_nothing_and_reserve_nothing() -> None:
    limits = stage_limits("b", 100, {"a": 30, "b": 40, "c": 50}, reserve_end=10)
    assert_limits(limits, {"a": 0, "b": 90, "c": 0})


def test_a_stage_with_less_than_the_minimum_left_is_skipped() -> None:
    assert_limits(stage_limits("a b", 40, {"a": 5, "b": 15}), {"a": 25, "b": 40})
    assert_limits(stage_limits("a b", 34, {"a": 5, "b": 15}), {"a": 0, "b": 34})
    assert_limits(stage_limits("a b", 15, {"a": 5, "b": 5}), {"a": 0, "b": 0})
