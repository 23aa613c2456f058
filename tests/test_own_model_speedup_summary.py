"""benchmarks/own_model/speedup_summary.py on made-up rows: the tables, the ratios, the targets."""

from __future__ import annotations

from pathlib import Path

from scripts import load_script

from lmscope.records.results import append_record, read_records

LLAMA = "hf:examples/llama-3.2-1b-shape.json"


def _row(setup: str, ms: float, peak: float, size: str = LLAMA, status: str = "ok", **extra) -> dict:
    fast = {"fast": True, "attention": "flash", "fast_replaced": "norm=33,mlp=16,attention=16,causal_lm=1"}
    flags = {"eager": {}, "compile": {"compile": True}, "liger": {"peer": "liger"}, "fast": fast}
    row = {"workload": "bench", "size": size, "batch_size": 4, "context_length": 2048, "precision": "bf16",
           "mode": "train-step", "attention": "sdpa", "compile": False, "fast": False, "peer": "none",
           "checkpoint": "none", "num_layers": None, "status": status, **flags[setup], **extra}
    if status == "ok":
        row.update(median_ms=ms, times_ms=[ms * f for f in (0.99, 1.0, 1.01, 1.0, 0.995, 1.005)],
                   peak_allocated_gib=peak, tokens_per_s=8192 / ms * 1e3, mfu_counted=0.4, compile_s=None,
                   cuda_graph_used=setup == "fast")
    return row


def test_tables_ratios_targets_and_plot(tmp_path: Path) -> None:
    module = load_script("benchmarks/own_model/speedup_summary.py", "own_model_speedup_summary")
    rows = [_row("eager", 200.0, 43.0), _row("compile", 150.0, 33.0), _row("liger", 160.0, 30.0),
            _row("fast", 120.0, 28.0),
            _row("eager", 90.0, 20.0, size="hf:examples/qwen2-0.5b-shape.json"),
            _row("fast", 100.0, 12.0, size="hf:examples/qwen2-0.5b-shape.json"),
            _row("liger", 0, 0, size="hf:examples/qwen2-0.5b-shape.json", status="error",
                 error="ValueError: --peer liger needs Liger-Kernel: pip install liger-kernel")]
    for row in rows:
        append_record(tmp_path / "bench.jsonl", row)
    assert module.main([str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "## llama-3.2-1b-shape, batch 4 x 2048" in text and "## qwen2-0.5b-shape, batch 4 x 2048" in text
    assert "- liger step / lmscope step: 1.333x [" in text  # 160 / 120
    assert "- at least 1.15x liger's step: met" in text and "- at least 1.0x compile's step: met" in text
    assert "- peak memory no higher than Liger's: met" in text
    assert "- eager step / lmscope step: 0.900x [" in text  # qwen2: 90 / 100, slower
    assert "- liger: error: ValueError: --peer liger needs Liger-Kernel" in text
    assert text.count("Targets (issue 38)") == 1  # the 1B shape only
    assert (tmp_path / "speedup.png").stat().st_size > 1000
    assert len(read_records(tmp_path / "bench.jsonl")) == len(rows)


def test_the_fastest_attention_backend_of_lmscope_is_compared() -> None:
    module = load_script("benchmarks/own_model/speedup_summary.py", "own_model_speedup_summary")
    groups = module.grouped([_row("liger", 130.0, 30.0), _row("fast", 120.0, 31.0),
                             _row("fast", 100.0, 29.0, attention="sdpa-cudnn")])
    setups = next(iter(groups.values()))
    assert module.setups_of(setups) == ["eager", "compile", "liger", "fast", "fast (sdpa-cudnn)"]
    lines = module.model_table(setups)
    assert "lmscope below: `fast (sdpa-cudnn)`." in lines
    assert any(line.startswith("- liger step / lmscope step: 1.300x [") for line in lines)


def test_compile_modes_are_variants_and_the_fastest_is_the_peer() -> None:
    module = load_script("benchmarks/own_model/speedup_summary.py", "own_model_speedup_summary")
    groups = module.grouped([_row("compile", 150.0, 33.0), _row("fast", 120.0, 31.0),
                             _row("compile", 110.0, 33.0, compile="max-autotune-no-cudagraphs")])
    setups = next(iter(groups.values()))
    assert module.setups_of(setups) == ["eager", "compile", "compile (max-autotune-no-cudagraphs)", "liger",
                                        "fast"]
    assert "- at least 1.0x compile's step: not met" in module.targets(setups)  # 110 < 120
    assert any(line.startswith("- compile (max-autotune-no-cudagraphs) step / lmscope step: 0.917x")
               for line in module.model_table(setups))


def test_missed_targets_say_so(tmp_path: Path) -> None:
    module = load_script("benchmarks/own_model/speedup_summary.py", "own_model_speedup_summary")
    groups = module.grouped([_row("liger", 130.0, 30.0), _row("fast", 120.0, 31.0)])
    lines = module.targets(next(iter(groups.values())))
    assert lines == ["- at least 1.15x liger's step: not met", "- at least 1.0x compile's step: not measured",
                     "- peak memory no higher than Liger's: not met"]


def test_the_readme_claim_renders_the_committed_rows(tmp_path: Path) -> None:
    """benchmarks/claims.py's own-model-speedup over rows where speedup_gpu.sh's are committed."""
    from lmscope.report.claims import Rows

    claims = load_script("benchmarks/claims.py", "claims_script_own_model")
    stamp = {"git_sha": "abc123", "time": "2026-11-28T10:00:00", "device_name": "NVIDIA H100 80GB HBM3"}
    folder = tmp_path / claims.OWN_SPEEDUP
    folder.mkdir(parents=True)
    for row in (_row("eager", 200.0, 43.0), _row("liger", 160.0, 30.0), _row("fast", 120.0, 28.0),
                _row("compile", 0, 0, status="timeout")):
        append_record(folder / "bench.jsonl", {**row, **stamp})
    text = claims.own_model_speedup(Rows(tmp_path))
    lines = text.splitlines()
    model = "| llama-3.2-1b-shape, batch 4 x 2048 |"
    assert any(line.startswith(f"{model} liger | 160.0 | 30.0 |") and "1.33x" in line for line in lines), text
    assert any("| compile | TIMEOUT |" in line for line in lines)
    assert any(line.startswith(f"{model} fast | 120.0 |") and line.endswith("|  |") for line in lines), text
    assert "abc123" in text and claims.OWN_SPEEDUP in text


def test_rounds_are_counted_and_their_spread_is_in_the_interval() -> None:
    """Three rounds per side: the table counts rounds (not steps over --steps), the interval
    resamples the rounds (so a round that ran slow widens it), and the compile time shown is the
    longest round's (the cold one)."""
    module = load_script("benchmarks/own_model/speedup_summary.py", "own_model_speedup_summary")
    rows = []
    for r, (liger_ms, fast_ms, compile_s) in enumerate([(130.0, 100.0, 40.0), (130.0, 120.0, 3.0),
                                                        (130.0, 100.0, 2.0)]):
        rounds = {"rounds": 3, "round": r}
        rows += [_row("liger", liger_ms, 30.0, **rounds), _row("fast", fast_ms, 28.0, **rounds),
                 {**_row("compile", 140.0, 33.0, **rounds), "compile_s": compile_s}]
    setups = next(iter(module.grouped(rows).values()))
    lines = module.model_table(setups)
    liger_line = next(line for line in lines if line.startswith("| liger |"))
    assert liger_line.split(" | ")[2] == "3"
    assert next(line for line in lines if line.startswith("| compile |")).split(" | ")[6] == "40"
    ratio, low, high = module.speedup(setups["liger"], setups["fast"])
    assert low <= 130.0 / 120.0 + 1e-9 and high >= 1.3 - 1e-9  # both kinds of round inside
