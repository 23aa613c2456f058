"""benchmarks/fast/summarize.py: which row a bench record is, and the long-context table's ratios."""

import random

import pytest
from scripts import load_script

from lmscope.records.stats import ratio_interval, ratio_interval_rounds


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


def test_the_summary_reads_the_copy_bandwidth_from_its_row_and_measures_nothing(summarize, tmp_path,
                                                                                 monkeypatch) -> None:
    """summary.md is a function of the rows in the run folder (the claims check regenerates it):
    the optimizer floor takes the bandwidth of copy_bandwidth.jsonl, never a new measurement."""
    import json

    monkeypatch.setattr(summarize, "copy_bandwidth_gbps", lambda: pytest.fail("measured"))
    rng = random.Random()
    parameters, optimizer_ms = rng.randrange(10**8, 10**9), rng.uniform(5, 20)
    bandwidth = rng.uniform(1e3, 4e3)
    xl = {"workload": "bench", "size": "xl", "context_length": 512, "batch_size": 4, "status": "ok",
          "median_ms": 70.0, "fast": True, "attention": "flash", "cuda_graph_used": True,
          "optimizer_ms": optimizer_ms, "parameters": parameters}
    (tmp_path / "bench.jsonl").write_text(json.dumps(xl) + "\n")
    assert "| xl optimizer <= 1.3x its memory floor | not measured | - |" in summarize.summary_text(tmp_path)
    (tmp_path / "copy_bandwidth.jsonl").write_text(json.dumps({"copy_bandwidth_gbps": bandwidth,
                                                               "status": "ok"}) + "\n")
    floor_ms = 28 * parameters / (bandwidth * 1e9) * 1e3
    text = summarize.summary_text(tmp_path)
    assert f"at {bandwidth:.0f} GB/s copy bandwidth) | {floor_ms:.2f} ms |" in text
    assert f"| xl optimizer <= 1.3x its memory floor | {optimizer_ms / floor_ms:.2f}x |" in text
    summarize.record_bandwidth(tmp_path)  # the run has its row: nothing measured again


def xl(variant_fields: dict, ms: float, **fields) -> dict:
    return {"size": "xl", "context_length": 512, "batch_size": 4, "status": "ok", "median_ms": ms,
            "mode": "train-step", "peak_tflops": 989.0, **variant_fields, **fields}


def test_compile_modes_and_scopes_are_rows_of_their_own(summarize) -> None:
    assert summarize.variant(record(512, 1.0, compile="reduce-overhead", attention="sdpa")) \
        == "compile-reduce-overhead"
    assert summarize.variant(record(512, 1.0, compile="max-autotune-no-cudagraphs", attention="sdpa",
                                    compile_scope="blocks")) == "compile-max-autotune-no-cudagraphs-blocks"
    assert summarize.variant(record(512, 1.0, compile=True, attention="sdpa", compile_scope="blocks")) \
        == "compile-blocks"
    assert summarize.variant(record(512, 1.0, peer="hf", compile="reduce-overhead", attention="sdpa",
                                    compile_scope="blocks")) == "hf-compile-reduce-overhead-blocks"


def test_one_mfu_convention_whole_step_headline_and_fwd_bwd_labelled(summarize) -> None:
    """MFU is model FLOPs with causal attention at half the square (lmscope.accounting.flops), the
    whole step the headline; the forward+backward one is labelled fwd+bwd wherever it is shown."""
    from lmscope.accounting.flops import forward_flops
    from lmscope.config import preset

    fast_row = xl({"fast": True, "attention": "flash", "cuda_graph_used": True}, 80.0, forward_ms=20.0,
                  backward_ms=40.0, optimizer_ms=20.0)
    rows = {summarize.row_key(fast_row): fast_row}
    forward = forward_flops(preset("xl", context_length=512), 4, 512)
    square = forward_flops(preset("xl", context_length=512), 4, 512, full_square=True)
    assert forward["attention"] == square["attention"] * 513 / 1024  # causal: half the square + diagonal
    whole = 3 * forward["total"] / 0.080 / 1e12 / 989.0
    fwd_bwd = 3 * forward["total"] / 0.060 / 1e12 / 989.0
    table = summarize.main_table(rows)
    header = next(line for line in table if line.startswith("| size |"))
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert "best fast MFU (whole step)" in cells and "fast fwd+bwd MFU" in cells
    line = next(line for line in table if line.startswith("| xl |"))
    values = [c.strip() for c in line.strip("|").split("|")]
    assert values[cells.index("best fast MFU (whole step)")] == f"{whole:.1%}"
    assert values[cells.index("fast fwd+bwd MFU")] == f"{fwd_bwd:.1%}"


def test_strongest_peers_table_lists_every_compile_mode_against_the_best_fast_row(summarize) -> None:
    rng = random.Random()
    fast_times = [rng.uniform(70.0, 74.0) for _ in range(12)]
    records = [xl({"fast": True, "attention": "flash", "cuda_graph_used": True}, 72.0, times_ms=fast_times)]
    for mode in (True, "max-autotune-no-cudagraphs", "reduce-overhead"):
        times = [t * rng.uniform(1.2, 1.5) for t in fast_times]
        records.append(xl({"compile": mode, "compile_scope": "blocks", "attention": "sdpa"},
                          sorted(times)[6], times_ms=times, compile_s=rng.uniform(5, 60), gpu_busy_share=0.93,
                          host_bound=False))
    records.append(xl({"attention": "sdpa"}, 180.0, gpu_busy_share=0.7, host_bound=True))
    records.append(xl({"peer": "hf", "attention": "sdpa"}, 170.0))
    hf_compiled = {"peer": "hf", "attention": "sdpa", "compile": "reduce-overhead", "compile_scope": "blocks"}
    records.append(xl(hf_compiled, 95.0, compile_s=20.0))
    rows = {summarize.row_key(r): r for r in records}
    table = summarize.strongest_peers(rows)
    names = [line.split("|")[2].strip() for line in table if line.startswith("| xl |")]
    assert names == ["sdpa", "compile-blocks", "compile-max-autotune-no-cudagraphs-blocks",
                     "compile-reduce-overhead-blocks", "hf", "hf-compile-reduce-overhead-blocks", "fast"]
    reduce = next(line for line in table if "| compile-reduce-overhead-blocks |" in line)
    assert ratio_interval(records[3]["times_ms"], fast_times).as_text() in reduce
    assert f"{records[3]['compile_s']:.1f}" in reduce
    eager = next(line for line in table if "| sdpa |" in line)
    assert eager.rstrip().endswith("| 70% | yes | - |")  # no times: no count
    assert reduce.rstrip().endswith(f"| 1 x {len(fast_times)} |")
    assert summarize.fastest_compile(rows, "xl") is min(records[1:4], key=lambda r: r["median_ms"])
    assert summarize.strongest_peers({summarize.row_key(records[0]): records[0]}) == []
