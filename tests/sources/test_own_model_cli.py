"""Each model source through the commands (bench, profile, memory, ddp) on the CPU, and bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lmscope.cli import main
from lmscope.running.runner import run_in_process

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
OWN_LM = f"{ROOT / 'examples' / 'own_lm.py'}:build"
MLP = f"{ROOT / 'examples' / 'mlp.py'}:build"
SMALL = ["--d-model", "32", "--num-layers", "2", "--num-heads", "2", "--vocab-size", "97"]
QUICK = ["--device", "cpu", "--warmup", "1", "--steps", "1"]
FIXED = ["--target-ci", "off"]  # bench: exactly --steps


def run_cli(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
        raise SystemExit(0)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def support_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(SUPPORT))
    paths = [str(SUPPORT), os.environ.get("PYTHONPATH")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))


def test_bench_a_module_file_and_an_hf_config_in_one_sweep(tmp_path, capsys):
    out = tmp_path / "bench.jsonl"
    code, stdout, _ = run_cli(capsys, "bench", "--model", f"{OWN_LM},hf:gpt2", *SMALL, *QUICK, *FIXED,
                              "--context-length", "12", "--batch-size", "3", "--out", out, "--reuse-worker")
    assert code == 0, stdout
    own, gpt2 = rows(out)
    assert (own["size"], own["model_source"], gpt2["model_source"]) == (OWN_LM, "factory", "hf")
    for row in (own, gpt2):
        assert row["status"] == "ok" and row["unit"] == "tokens" and row["flops_per_step"] is None
        assert row["tokens_per_s"] == pytest.approx(3 * 12 / (row["median_ms"] / 1e3))
        assert row["forward_ms"] > 0 and row["backward_ms"] > 0 and row["optimizer_ms"] > 0
    # own_lm: tied 97x32 embedding, 12 learned positions, 2 blocks of 12,704 (2 norms 128, qkv 3,168,
    # proj 1,056, mlp 8,352), final norm 64
    assert own["parameters"] == 97 * 32 + 12 * 32 + 2 * 12_704 + 64


def test_bench_and_memory_of_a_model_in_samples(tmp_path, capsys):
    out = tmp_path / "bench.jsonl"
    code, _, _ = run_cli(capsys, "bench", "--model", MLP, "--d-model", "16", "--num-layers", "2", *QUICK,
                         *FIXED, "--batch-size", "5", "--out", out)
    assert code == 0
    (row,) = rows(out)
    assert row["status"] == "ok" and row["unit"] == "samples" and "tokens_per_s" not in row
    assert row["samples_per_s"] == pytest.approx(5 / (row["median_ms"] / 1e3))
    out = tmp_path / "memory.jsonl"
    code, _, _ = run_cli(capsys, "memory", "--model", MLP, "--d-model", "16", "--num-layers", "2", *QUICK,
                         "--checkpoint", "block", "--snapshot", "off", "--out", out)
    assert code == 0
    (row,) = rows(out)
    assert row["status"] == "ok" and row["checkpointed_blocks"] == 2 and row["unit"] == "samples"
    assert row["predicted_step_peak_gib"] is None and row["step_peak_error_pct"] is None
    assert row["step_peak_gib"] >= row["forward_peak_gib"] > 0


def test_profile_of_an_hf_config_json_and_a_factory_in_a_module(tmp_path, capsys, support_on_path):
    config = tmp_path / "config.json"  # --d-model 32 applies to both points: hidden 48 -> 32
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 48, "intermediate_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 101}))
    out = tmp_path / "profile.jsonl"
    code, _, _ = run_cli(capsys, "profile", "--model", f"hf:{config},own_models:regression",
                         "--d-model", "32", *QUICK, "--context-length", "10", "--mode", "forward-backward",
                         "--out", out, "--reuse-worker")
    assert code == 0
    llama, regression = rows(out)
    assert llama["status"] == regression["status"] == "ok"
    assert (llama["model_source"], regression["unit"]) == ("hf", "samples")
    for row in (llama, regression):
        assert row["launches_per_step"] > 0 and Path(row["report_path"]).is_file()
        assert row["forward_wall_ms"] > 0 and row["backward_wall_ms"] > 0
    assert "own_models_regression" in regression["trace_path"]


def test_memory_of_an_hf_model_with_checkpointed_layers(tmp_path, capsys):
    out = tmp_path / "memory.jsonl"
    code, _, _ = run_cli(capsys, "memory", "--model", "hf:gpt2", *SMALL, *QUICK, "--context-length", "64",
                         "--batch-size", "4", "--mode", "forward-backward", "--checkpoint", "none,block",
                         "--out", out)
    assert code == 0
    plain, checkpointed = rows(out)
    assert plain["status"] == checkpointed["status"] == "ok" and checkpointed["checkpointed_blocks"] == 2
    assert checkpointed["forward_peak_gib"] < plain["forward_peak_gib"]  # the blocks save only inputs
    assert Path(plain["timeline_png"]).is_file() and plain["top_allocations"]


def test_ddp_of_a_user_model_on_two_gloo_ranks(tmp_path, capsys):
    out = tmp_path / "ddp.jsonl"
    code, _, _ = run_cli(capsys, "ddp", "--model", OWN_LM, *SMALL, "--device", "cpu", "--nproc", "2",
                         "--strategy", "flat", "--precision", "fp32", "--context-length", "8",
                         "--batch-size", "2", "--warmup", "1", "--steps", "2", "--out", out)
    assert code == 0
    by_strategy = {row["strategy"]: row for row in rows(out)}
    assert set(by_strategy) == {"single", "flat"}
    flat = by_strategy["flat"]
    assert flat["status"] == "ok" and flat["model_source"] == "factory" and flat["unit"] == "tokens"
    assert flat["tokens_per_s"] == pytest.approx(2 * 2 * 8 / (flat["step_ms"] / 1e3))
    assert flat["parameters"] == by_strategy["single"]["parameters"] > 0


def test_a_model_that_does_not_fit_is_an_oom_row_and_the_sweep_goes_on(tmp_path, capsys, support_on_path):
    out = tmp_path / "bench.jsonl"
    code, _, _ = run_cli(capsys, "bench", "--model", "own_models:too_big,own_models:regression",
                         *QUICK, *FIXED,
                         "--out", out)
    assert code == 0
    big, small = rows(out)
    assert (big["status"], small["status"]) == ("oom", "ok") and "out of memory" in big["error"]


@pytest.mark.parametrize(("args", "message"), [
    (["bench", "--model", "own_models:raises"], "own_models:raises raised RuntimeError"),
    (["profile", "--model", "own_models:wrong_type"], "returned a Linear, not an lmscope.sources.UserModel"),
    (["memory", "--model", "no_such_module_for_lmscope:build"], "cannot import module"),
    (["bench", "--model", "own_models:regression", "--num-heads", "3"], "takes no num_heads argument"),
    (["bench", "--model", "hf:not_a_model_type"], "unknown transformers model_type 'not_a_model_type'"),
    (["memory", "--model", "hf:nowhere/config.json"], "hf config nowhere/config.json does not exist"),
    (["memory", "--model", "own_models:regression", "--checkpoint", "block"], "exposes no blocks"),
    (["bench", "--model", "own_models:regression", "--peer", "hf"], "--peer hf is not a peer of own_models"),
    (["bench", "--model", "hf:gpt2", "--fast", "on", "--attention", "sdpa"],
     "families lmscope's fast path runs (transformers' llama, qwen2, mistral)"),
    (["bench", "--model", "tiny", "--size", "tiny"], "--model and --size name the same thing"),
    (["ddp", "--model", MLP, "--shard-optimizer", "on", "--device", "cpu"], "brings its own optimizer"),
])
def test_bad_model_input_is_one_line_and_exit_2(capsys, support_on_path, tmp_path, args, message):
    code, _, err = run_cli(capsys, *args, "--out", tmp_path / "r.jsonl")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmscope: error: ") and message in lines[0], err
    assert "Traceback" not in err


def test_a_factory_that_exits_while_checked_is_one_line_naming_it(capsys, support_on_path, tmp_path):
    code, _, err = run_cli(capsys, "bench", "--model", "own_models:exits", "--device", "cpu",
                           "--out", tmp_path / "r.jsonl")
    assert code == 2 and err.strip() == ("lmscope: error: own_models:exits called sys.exit(3) instead of "
                                         "returning a UserModel")


def test_a_factory_that_exits_in_the_worker_is_an_error_row_naming_it(capsys, support_on_path, tmp_path):
    out = tmp_path / "r.jsonl"
    models = "own_models:exits_on_the_device,own_models:regression"
    code, stdout, _ = run_cli(capsys, "bench", "--model", models, *QUICK, *FIXED, "--out", out)
    exited, fine = rows(out)
    assert code == 1 and exited["status"] == "error" and fine["status"] == "ok"
    assert "own_models:exits_on_the_device called sys.exit(3)" in exited["error"]
    assert "error" in stdout  # the table shows the failed point


def test_sys_exit_anywhere_in_a_point_is_an_error_row(monkeypatch):
    import lmscope.workloads.step as step

    monkeypatch.setattr(step, "run_point", lambda spec: exit(4))
    record = run_in_process("bench", {})
    assert record == {"status": "error", "error": "SystemExit: the point's code called sys.exit(4)"}
