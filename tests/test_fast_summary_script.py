"""benchmarks/fast/summarize.py: which row a bench record is, and the long-context table's ratios."""

import random

import pytest
from scripts import load_script

from lmscope.stats import ratio_interval, ratio_interval_rounds


@pytest.fixture(scope="module")
def summarize():
    return load_script("benchmarks/fast/summarize.py", "fast_summarize")


def record(context: int, ms: float, **fields) -> dict:
    return {"size": "large", "context_length": context, "batch_size": 1, "status": "ok",
            "median_ms": ms, "peak_allocated_gib": ms / 10, **fields}


def fast(context: int, ms: float, attention: str, in_backward: bool) -> dict:
    return record(context, ms, fast=True, attention=attention, optimizer_in_backward=in_backward,
                  cuda_graph_used=True)


def test_fast_rows_are_keyed_by_attention_and_optimizer_mode(summarize) -> None:
    assert summarize.variant(fast(512, 1.0, "flash", False)) == "fast"
    assert summarize.variant(fast(512, 1.0, "flash", True)) == "fast-inbwd"
    assert summarize.variant(fast(512, 1.0, "sdpa", False)) == "fast-sdpa"
    assert summarize.variant(fast(512, 1.0, "sdpa", True)) == "fast-sdpa-inbwd"
    eager = {**fast(512, 1.0, "flash", False), "cuda_graph_used": False}
    assert summarize.variant(eager) == "fast-eager"
    assert summarize.variant(record(512, 1.0, peer="hf", attention="sdpa")) == "hf"
    assert summarize.variant(record(512, 1.0, compile=True, attention="sdpa")) == "compile"
    assert summarize.variant(record(512, 1.0, attention="naive")) == "naive"


def test_long_table_compares_the_peers_with_the_fastest_of_the_four_fast_rows(summarize) -> None:
    rng = random.Random()
    times = {name: rng.uniform(100.0, 500.0) for name in ("flash", "flash-inbwd", "sdpa", "sdpa-inbwd")}
    compile_ms = rng.uniform(100.0, 500.0)
    rows = [fast(16384, times["flash"], "flash", False), fast(16384, times["flash-inbwd"], "flash", True),
            fast(16384, times["sdpa"], "sdpa", False), fast(16384, times["sdpa-inbwd"], "sdpa", True),
            record(16384, compile_ms, compile=True, attention="sdpa"),
            {**fast(16384, 1.0, "sdpa", True), "context_length": 8192, "status": "oom", "median_ms": None}]
    table = summarize.long_table({summarize.row_key(r): r for r in rows})
    line = next(row for row in table if row.startswith("| 16384 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    best_name, best_ms = min(times.items(), key=lambda item: item[1])
    assert cells[1:5] == [f"{times[n]:.1f}" for n in ("flash", "flash-inbwd", "sdpa", "sdpa-inbwd")]
    assert cells[6] == f"{compile_ms:.1f}"
    assert cells[9] == f"{compile_ms / best_ms:.2f}x (no interval)"  # rows without times_ms
    assert cells[11] == {"flash": "fast", "flash-inbwd": "fast-inbwd", "sdpa": "fast-sdpa",
                         "sdpa-inbwd": "fast-sdpa-inbwd"}[best_name]
    assert cells[12] == f"{best_ms / 10:.1f}"
    failed = next(row for row in table if row.startswith("| 8192 |"))
    assert "OOM" in failed


def test_ratios_carry_the_interval_of_the_per_step_times(summarize) -> None:
    rng = random.Random()
    fast_times = [rng.uniform(9.0, 11.0) for _ in range(20)]
    hf_times = [2.5 * t for t in fast_times]
    rows = [{**fast(16384, 10.0, "flash", False), "times_ms": fast_times},
            {**record(16384, 25.0, peer="hf", attention="sdpa"), "times_ms": hf_times}]
    line = next(row for row in summarize.long_table({summarize.row_key(r): r for r in rows})
                if row.startswith("| 16384 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[10] == ratio_interval(hf_times, fast_times).as_text()
    assert cells[10].startswith("2.50x [")


def test_interleaved_rounds_are_pooled_before_the_ratio(summarize, tmp_path) -> None:
    import json

    base = {"workload": "bench", "size": "large", "context_length": 16384, "batch_size": 1, "status": "ok",
            "peak_allocated_gib": 1.0, "rounds": 3}
    fast_rounds = [[10.0, 10.2], [10.4, 10.6], [10.1, 10.5]]
    hf_rounds = [[25.0, 25.5], [26.0, 26.5], [25.2, 25.9]]
    lines = []
    for r in range(3):
        lines.append({**base, "fast": True, "attention": "flash", "optimizer_in_backward": False,
                      "cuda_graph_used": True, "round": r, "times_ms": fast_rounds[r],
                      "median_ms": sum(fast_rounds[r]) / 2})
        lines.append({**base, "peer": "hf", "attention": "sdpa", "round": r, "times_ms": hf_rounds[r],
                      "median_ms": sum(hf_rounds[r]) / 2})
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = summarize.latest(path)
    fast_all = sum(fast_rounds, [])
    assert rows[("large", 16384, 1, "fast")]["times_ms"] == fast_all
    assert rows[("large", 16384, 1, "fast")]["median_ms"] == 10.3
    line = next(row for row in summarize.long_table(rows) if row.startswith("| 16384 |"))
    # the interval resamples the rounds: the unit that varies independently
    assert ratio_interval_rounds(hf_rounds, fast_rounds).as_text() in line and "x [" in line
