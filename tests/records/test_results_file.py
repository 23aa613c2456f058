"""Results files as commands meet them: torn lines, skipped lines said, foreign files and other
commands' files refused, empty list items refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmscope.cli import main, sweep
from lmscope.records.results import TORN, append_record, scan_results, set_aside_torn_line
from lmscope.records.results_check import prepare_out, read_rows, writer_of
from lmscope.running.runner import spec_dict
from lmscope.workloads.step import Spec

POINT = dict(size="tiny", context_length=16, mode="forward", device="cpu", warmup=0, steps=1)


def run_cli(capsys, *args):
    with pytest.raises(SystemExit) as exit_info:
        main([str(a) for a in args])
        raise SystemExit(0)
    captured = capsys.readouterr()
    return exit_info.value.code or 0, captured.out, captured.err


def _row(workload: str = "bench", **fields) -> dict:
    return {"workload": workload, "status": "ok", "median_ms": 1.5, **fields}


def _torn(path: Path, rows: list[dict]) -> str:
    """`rows` as JSON lines, the last one cut in half with no end of line; returns the fragment."""
    last = json.dumps(rows[-1])
    fragment = last[: len(last) // 2]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[:-1]) + fragment)
    return fragment


def test_a_row_appended_after_a_torn_line_starts_its_own_line(tmp_path):
    path = tmp_path / "r.jsonl"
    _torn(path, [_row(batch_size=1), _row(batch_size=2)])
    append_record(path, _row(batch_size=3))
    scanned = scan_results(path)
    assert [r["batch_size"] for r in scanned.records] == [1, 3]
    assert [(s.number, s.reason) for s in scanned.skipped] == [(2, "not JSON")]


def test_the_reader_says_which_lines_it_skipped_and_why(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_row()) + "\n\n[1, 2]\nhello\n" + json.dumps(_row()) + "\n{\"work")
    scanned = scan_results(path)
    assert len(scanned.records) == 2 and scanned.torn
    assert [(s.number, s.reason) for s in scanned.skipped] == [(3, "a JSON list, not a row"),
                                                               (4, "not JSON"), (6, TORN)]
    assert scanned.skipped_note() == (f"{path}: skipped 3 line(s) that hold no row: line 3 (a JSON list, "
                                      f"not a row), line 4 (not JSON), line 6 ({TORN})")
    assert "line 6" not in scanned.skipped_note(torn=False)


def test_a_torn_last_line_is_set_aside_whole(tmp_path):
    path = tmp_path / "r.jsonl"
    fragment = _torn(path, [_row(batch_size=1), _row(batch_size=2)])
    aside = set_aside_torn_line(path)
    assert aside == tmp_path / "r.jsonl.torn" and aside.read_text() == fragment + "\n"
    assert path.read_text() == json.dumps(_row(batch_size=1)) + "\n"
    assert set_aside_torn_line(path) is None and not scan_results(path).skipped


def test_resume_after_a_torn_line_remeasures_the_point_and_keeps_the_file_readable(tmp_path, capsys):
    out = tmp_path / "results.jsonl"
    first, second = (Spec(**POINT, batch_size=b) for b in (1, 2))
    rows = [{"workload": "bench", **spec_dict(s), "status": "ok", "median_ms": 1.0} for s in (first, second)]
    fragment = _torn(out, rows)
    code, stdout, err = run_cli(capsys, "bench", "--size", "tiny", "--context-length", "16",
                                "--mode", "forward", "--batch-size", "1,2", "--warmup", "0", "--steps", "1",
                                "--target-ci", "off", "--device", "cpu", "--out", out, "--resume")
    assert code == 0 and "2 point(s), 1 to run" in stdout
    assert f"moved its cut-off last line (a run killed while writing it) to {out}.torn" in err
    lines = out.read_text().splitlines()
    assert all(isinstance(json.loads(line), dict) for line in lines)  # every line reads
    batch_sizes = [json.loads(line)["batch_size"] for line in lines]
    assert batch_sizes == [1, 2] and json.loads(lines[1])["median_ms"] != 1.0  # measured again
    assert (tmp_path / "results.jsonl.torn").read_text() == fragment + "\n"


def test_table_says_what_it_skipped(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    _torn(path, [_row(batch_size=1), _row(batch_size=2)])
    code, stdout, err = run_cli(capsys, "table", path)
    assert code == 0 and "1.5" in stdout
    assert err.strip() == f"lmscope: warning: {path}: skipped 1 line(s) that hold no row: line 2 ({TORN})"


FOREIGN = {
    "empty": ("", "is empty"),
    "garbage": ("\x00\x9f\x92\x96garbage\xff\n", "none of its 1 line(s) is a JSON row (line 1: not JSON)"),
    "plain text": ("hello\nworld\n", "none of its 2 line(s) is a JSON row"),
    "foreign JSON": ('{"a": 1}\n', "its 1 JSON object(s) have no workload field"),
}


@pytest.mark.parametrize("command", ["table", "report"])
@pytest.mark.parametrize("kind", list(FOREIGN))
def test_table_and_report_refuse_files_without_lmscope_rows_alike(tmp_path, capsys, command, kind):
    text, message = FOREIGN[kind]
    path = tmp_path / "r.jsonl"
    path.write_bytes(text.encode("utf-8", errors="surrogateescape") if kind != "garbage"
                     else b"\x00\x9f\x92\x96garbage\xff\n")
    code, _, err = run_cli(capsys, command, path)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "report.html").exists()


def test_report_says_what_it_left_out_in_the_page_and_on_the_terminal(tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    bench = Path(__file__).parents[2] / "benchmarks" / "results" / "bench" / "bench.jsonl"
    (folder / "results.jsonl").write_text("\n".join(bench.read_text().splitlines()[:2]) + "\nnot json\n")
    (folder / "notes.jsonl").write_text("hello\n")
    code, _, err = run_cli(capsys, "report", folder)
    assert code == 0
    assert "skipped 1 line(s) that hold no row: line 3 (not JSON)" in err
    assert f"left out {folder / 'notes.jsonl'} holds no lmscope rows" in err
    assert "line 3 (not JSON)" in (folder / "report.md").read_text()


def test_read_rows_leaves_out_objects_without_a_workload_and_says_so(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_row()) + "\n" + json.dumps({"a": 1}) + "\n")
    rows = read_rows(path)
    assert len(rows.records) == 1
    assert rows.notes == [f"{path}: left out 1 JSON object(s) without a workload field (not lmscope rows)"]


@pytest.mark.parametrize(("command", "written_by"), [
    (["bench", "--size", "tiny", "--device", "cpu"], "profile"),
    (["profile", "--size", "tiny", "--device", "cpu"], "memory"),
    (["memory", "--size", "tiny", "--device", "cpu"], "bench"),
    (["comm", "--nproc", "2", "--backend", "gloo", "--size", "1MB"], "bench"),
    (["bench", "--size", "tiny", "--device", "cpu"], "lmscope.study.accounting_point"),
])
def test_appending_to_another_commands_results_file_is_refused_naming_it(
        tmp_path, capsys, monkeypatch, command, written_by):
    out = tmp_path / "results.jsonl"
    out.write_text(json.dumps(_row(written_by)) + "\n")
    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: pytest.fail("must not run"))
    code, _, err = run_cli(capsys, *command, "--out", out, "--resume")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"holds rows of {writer_of(written_by)}, not of lmscope {command[0]}" in err
    assert out.read_text() == json.dumps(_row(written_by)) + "\n"


def test_prepare_out_takes_its_own_file_and_refuses_a_text_file(tmp_path):
    out = tmp_path / "results.jsonl"
    assert prepare_out("bench", out) == []
    out.write_text(json.dumps(_row()) + "\n")
    assert prepare_out("bench", out) == []
    out.write_text("my notes\n")
    with pytest.raises(ValueError, match="is not a results file"):
        prepare_out("bench", out)
    assert writer_of("lmscope.study.precision_point") == "lmscope study"
    assert writer_of("probe") == "the Probe API (lmscope.probe)"


@pytest.mark.parametrize("args", [
    ["bench", "--context-length", "16,,32"],
    ["bench", "--batch-size", "2,"],
    ["memory", "--checkpoint", "none,,block"],
    ["memory", "--checkpoint", "none;;every:2"],
    ["attention", "--passes", "fwd,,bwd"],
])
def test_an_empty_item_in_a_list_flag_is_refused(capsys, monkeypatch, tmp_path, args):
    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: pytest.fail("must not run"))
    code, _, err = run_cli(capsys, *args, "--device", "cpu", "--out", tmp_path / "r.jsonl")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "has an empty item" in err, err
