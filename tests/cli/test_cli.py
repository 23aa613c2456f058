"""The command line as a user meets it: a tiny bench end to end, tables, and one-line errors."""

import json
import statistics
import subprocess
import sys

import pytest

from lmscope.cli import main
from lmscope.records.stats import ratio_interval, ratio_interval_rounds


def run_cli(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
        raise SystemExit(0)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_bench_tiny_end_to_end_then_table_and_resume(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    code, stdout, _ = run_cli(
        capsys, "bench", "--size", "tiny", "--context-length", "16,24", "--mode", "forward,train-step",
        "--steps", "2", "--target-ci", "off", "--warmup", "1", "--device", "cpu", "--out", str(out),
        "--format", "csv",
    )
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["context_length"], r["mode"]) for r in rows] == [
        (16, "forward"), (16, "train-step"), (24, "forward"), (24, "train-step")]
    train = rows[1]
    assert train["status"] == "ok" and train["n"] == 2 and len(train["times_ms"]) == 2
    assert train["forward_ms"] > 0 and train["backward_ms"] > 0 and train["optimizer_ms"] > 0
    assert train["parameters"] == 1_386_816 and train["mfu"] is None and train["tokens_per_s"] > 0
    assert (tmp_path / "results.csv").read_text().startswith("context_length,mode,mean_ms")
    assert "4 point(s), 4 to run" in stdout

    code, stdout, _ = run_cli(capsys, "bench", "--size", "tiny", "--context-length", "16,24",
                              "--mode", "forward,train-step", "--steps", "2", "--target-ci", "off",
                              "--warmup", "1", "--device", "cpu", "--out", str(out), "--resume")
    assert code == 0 and "4 point(s), 0 to run" in stdout

    code, stdout, _ = run_cli(capsys, "table", str(out), "--compare", "mode", "--format", "md")
    assert code == 0 and "ratio forward/train-step" in stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "--sise", "tiny"], "No such option: --sise"),
        (["bench", "--size", "huge"], "unknown model size 'huge'"),
        (["bench", "--size", "tiny", "--num-heads", "7"], "not divisible by num_heads 7"),
        (["bench", "--context-length", "12x"], "--context-length takes integers"),
        (["bench", "--mode", "backward"], "unknown mode 'backward'"),
        (["bench", "--precision", "fp8"], "unknown precision 'fp8'"),
        (["bench", "--compile", "maybe"], "'maybe': choose one of off, on, max-autotune-no-cudagraphs"),
        (["bench", "--size", "tiny", "--context-length", "512", "--model-context-length", "256"],
         "exceeds the model's context_length 256"),
        (["bench", "--batch-size", "0"], "batch_size must be a positive integer"),
        (["bench", "--format", "xlsx"], "unknown format 'xlsx'"),
        (["table", "no/such/file.jsonl"], "no results file"),
        (["table", "."], ". is not a file"),
        (["bench", "--out", "."], "--out . is a folder"),
        (["bench", "--timeout", "-1"], "--timeout must be a positive number"),
        (["bench", "--size", "tiny", "--compare", "precision"], "cannot compare by 'precision'"),
        (["bench", "--size", "tiny", "--device", "cuda:99"], "--device cuda:99"),
        (["bench", "--size", "tiny", "--rounds", "0"], "--rounds must be a whole number of at least 1"),
        (["bench", "--size", "tiny", "--compare-base", "bf16"], "pass --compare FIELD too"),
        (["bench", "--size", "tiny", "--rounds", "3", "--round", "3"], "--round must lie in 0..2"),
        (["bench", "--size", "tiny", "--precision", "fp32,bf16", "--compare", "precision",
          "--compare-base", "fp16"], "--compare-base 'fp16' is not a value of precision"),
        (["benchh"], "No such command 'benchh'"),
        (["precision", "accumulate", "--device", "cuda"], "no CUDA GPU is visible"),
        (["precision", "accumulate", "--device", "tpu"], "unknown device 'tpu'"),
        (["precision", "autocast", "--device", "tpu"], "unknown device 'tpu'"),
        (["comm", "--timeout", "inf"], "--timeout must be a positive number of seconds, got inf"),
        (["ddp", "--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
        (["bench", "--timeout", "inf"], "--timeout must be a positive number of seconds, got inf"),
        (["profile", "--timeout", "1e300"], "is too long: at most"),
        (["attention", "--rep-ms", "inf"], "both finite"),
        (["bench", "--batch-size", "99999999999999999999"], "batch_size 99999999999999999999 is too large"),
        (["bench", "--steps", "99999999999999999999"], "steps 99999999999999999999 is too many steps"),
        (["comm", "--iters", "99999999999999999999"], "iters 99999999999999999999 is too many calls"),
        (["bench", "--d-model", "99999999999999999998"], "d_model 99999999999999999998 is too large"),
        (["memory", "--warmup", "9999999999"], "warmup 9999999999 is too many steps"),
        (["bench", "--target-ci", "2"], "target_ci must be a relative half-width from 0 (off) up to 1"),
        (["bench", "--target-ci", "tight"], "--target-ci takes a relative half-width such as 0.01"),
        (["bench", "--max-time", "0"], "max_time_s must be a positive number of seconds"),
        (["bench", "--max-time", "nan"], "pass --max-time 10"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lmscope: error: ") and message in lines[0]
    assert "Traceback" not in err


def test_bench_rounds_interleave_and_the_table_pools_them_with_an_interval(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    code, stdout, _ = run_cli(capsys, "bench", "--size", "tiny", "--context-length", "16",
                              "--mode", "forward", "--attention", "naive,sdpa", "--steps", "3",
                              "--target-ci", "off", "--warmup", "1", "--rounds", "3", "--device", "cpu",
                              "--out", str(out), "--compare", "attention", "--compare-base", "sdpa")
    assert code == 0 and "2 point(s) x 3 rounds, 6 to run" in stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["attention"], r["round"]) for r in rows] == [
        ("naive", 0), ("sdpa", 0), ("naive", 1), ("sdpa", 1), ("naive", 2), ("sdpa", 2)]
    assert all(r["status"] == "ok" and len(r["times_ms"]) == 3 and r["stop_reason"] == "steps" for r in rows)
    code, stdout, _ = run_cli(capsys, "table", str(out), "--compare", "attention", "--compare-base",
                              "sdpa", "--format", "json")
    (row,) = json.loads(stdout[stdout.index("[\n  {"):])  # the json after the terminal table
    naive = [r["times_ms"] for r in rows if r["attention"] == "naive"]
    sdpa = [r["times_ms"] for r in rows if r["attention"] == "sdpa"]
    # the interval resamples the rounds (separate processes), not the 9 steps as if independent
    assert row["ratio sdpa/naive"] == ratio_interval_rounds(sdpa, naive).as_text()
    assert row["ratio sdpa/naive"] != ratio_interval(sum(sdpa, []), sum(naive, [])).as_text()
    naive = sum(naive, [])
    assert row["median_ms attention=naive"] == pytest.approx(statistics.median(naive))


def test_console_script_module_entry_reports_errors_without_traceback():
    result = subprocess.run([sys.executable, "-m", "lmscope", "bench", "--size", "nope"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("lmscope: error: unknown model size 'nope'")


def test_help_lists_the_commands(capsys):
    code, stdout, _ = run_cli(capsys, "--help")
    assert code == 0 and "bench" in stdout and "table" in stdout
