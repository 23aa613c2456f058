"""benchmarks/fast/summarize.py: which row a bench record is, and the long-context table's ratios."""

import importlib.util
import random
from pathlib import Path

import pytest

SUMMARIZE = Path(__file__).resolve().parents[1] / "benchmarks" / "fast" / "summarize.py"


@pytest.fixture(scope="module")
def summarize():
    spec = importlib.util.spec_from_file_location("fast_summarize", SUMMARIZE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    assert cells[9] == f"{compile_ms / best_ms:.2f}x"
    assert cells[11] == {"flash": "fast", "flash-inbwd": "fast-inbwd", "sdpa": "fast-sdpa",
                         "sdpa-inbwd": "fast-sdpa-inbwd"}[best_name]
    assert cells[12] == f"{best_ms / 10:.1f}"
    failed = next(row for row in table if row.startswith("| 8192 |"))
    assert "OOM" in failed
