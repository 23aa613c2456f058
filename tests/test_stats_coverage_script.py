"""benchmarks/stats/coverage.py: each run's round-level interval against the other runs' pooled ratio."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from scripts import load_script

from lmscope.records.stats import ratio_interval_rounds


@pytest.fixture(scope="module")
def coverage():
    return load_script("benchmarks/stats/coverage.py", "stats_coverage")


def bench_rows(run: int, rounds: list[tuple[list[float], list[float]]]) -> list[dict]:
    """The rows `lmscope bench --attention naive,sdpa --rounds R` writes: A, B, A, B, ..."""
    rows = []
    for index, pair in enumerate(rounds):
        for attention, times in zip(("naive", "sdpa"), pair, strict=True):
            rows.append({"workload": "bench", "size": "tiny", "attention": attention, "round": index,
                         "rounds": len(rounds), "status": "ok", "times_ms": list(times),
                         "median_ms": statistics.median(times), "time": f"2026-11-28T0{run}:00:00",
                         "host": "h", "device_name": "cpu", "torch": "2", "git_sha": "abc"})
    return rows


def draw_run(rng, offset: float = 0.0) -> list[tuple[list[float], list[float]]]:
    return [(list(2.0 * np.exp(offset + rng.normal(0, 0.02) + rng.normal(0, 0.01, 8))),
             list(np.exp(rng.normal(0, 0.02) + rng.normal(0, 0.01, 8)))) for _ in range(4)]


def test_each_run_is_checked_against_the_pooled_ratio_of_the_others(coverage):
    rng = np.random.default_rng()
    runs = [draw_run(rng) for _ in range(5)] + [draw_run(rng, offset=0.5)]  # the last run is off
    pairs = [coverage.run_pair(bench_rows(i, run), "attention", "naive") for i, run in enumerate(runs)]
    rows = coverage.leave_one_out(pairs)
    assert [r["run"] for r in rows] == list(range(6))
    first = rows[0]
    naive = [t for run in runs[1:] for pair in run for t in pair[0]]
    sdpa = [t for run in runs[1:] for pair in run for t in pair[1]]
    assert first["others_ratio"] == pytest.approx(statistics.median(naive) / statistics.median(sdpa))
    expected = ratio_interval_rounds([p[0] for p in runs[0]], [p[1] for p in runs[0]])
    assert (first["ratio"], first["low"], first["high"]) == (expected.ratio, expected.low, expected.high)
    assert (first["rounds_base"], first["steps_base"]) == (4, 32)
    assert first["covers"] == (expected.low <= first["others_ratio"] <= expected.high)
    assert rows[-1]["covers"] is False  # a run off by its own factor misses what the others measure
    assert rows[-1]["ratio"] > 2.0 * np.exp(0.4)


def test_too_few_rounds_cover_nothing(coverage):
    rng = np.random.default_rng()
    runs = [draw_run(rng)[:2] for _ in range(3)]
    rows = coverage.leave_one_out([coverage.run_pair(bench_rows(i, r), "attention", None)
                                   for i, r in enumerate(runs)])
    assert all(r["low"] is None and not r["covers"] and "2 rounds" in r["reason"] for r in rows)


def test_main_writes_the_rows_and_the_summary(coverage, tmp_path):
    rng = np.random.default_rng()
    paths = []
    for i in range(3):
        path = tmp_path / f"run-{i}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in bench_rows(i, draw_run(rng))))
        paths.append(str(path))
    assert coverage.main([*paths, "--out", str(tmp_path / "out"), "--command", "lmscope bench X"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "coverage.jsonl").read_text().splitlines()]
    assert [r.get("run") for r in rows[:3]] == [0, 1, 2] and rows[-1]["summary"] is True
    assert rows[-1]["covered"] == sum(r["covers"] for r in rows[:3])
    assert rows[0]["command"] == "lmscope bench X"
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "`lmscope bench X`" in summary and f"{rows[-1]['covered']} of 3 intervals cover" in summary
    assert "attention=naive over attention=sdpa" in summary and "2026-11-28T00:00:00" in summary


def test_a_run_must_compare_two_values(coverage):
    rows = [r for r in bench_rows(0, draw_run(np.random.default_rng())) if r["attention"] == "naive"]
    with pytest.raises(ValueError, match="two values of attention"):
        coverage.run_pair(rows, "attention", None)
