"""The claims check: generated blocks from rows, stale blocks, missing rows, mixed commits, prose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripts import load_script

from lmscope.report.claims import ClaimError, Registry, Rows, check_files, fmt, ratio, table


def _rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _row(impl: str, ms: float, sha: str = "aaaa", **extra) -> dict:
    return {"impl": impl, "median_ms": ms, "git_sha": sha, "status": "ok", "device_name": "GPU",
            "time": "2026-11-23T10:00:00+00:00", **extra}


def _registry(root: Path) -> Registry:
    registry = Registry(root)

    @registry.claim("speed")
    def speed(rows: Rows) -> str:
        ours = rows.one("benchmarks/results/x/*.jsonl", impl="ours")
        peer = rows.one("benchmarks/results/x/*.jsonl", impl="peer")
        return table(["ours ms", "peer / ours"], [[fmt(ours["median_ms"]), ratio(peer, ours)]])

    return registry


def _doc(root: Path, body: str) -> Path:
    path = root / "docs" / "a.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return path


GOOD = ("Intro.\n\n<!-- claims: speed -->\n| ours ms | peer / ours |\n|---|---|\n| 2.50 | 1.60x |\n"
        "<!-- /claims -->\n")


def test_a_block_matching_its_rows_passes_and_write_fills_an_empty_one(tmp_path: Path) -> None:
    _rows(tmp_path / "benchmarks/results/x/r.jsonl", [_row("ours", 2.5), _row("peer", 4.0)])
    doc = _doc(tmp_path, GOOD)
    assert check_files([doc], _registry(tmp_path)) == []
    doc.write_text("Intro.\n\n<!-- claims: speed -->\n<!-- /claims -->\n")
    assert check_files([doc], _registry(tmp_path), write=True) == []
    assert doc.read_text() == GOOD


def test_a_stale_block_fails_naming_file_and_line(tmp_path: Path) -> None:
    _rows(tmp_path / "benchmarks/results/x/r.jsonl", [_row("ours", 2.5), _row("peer", 5.0)])
    problems = check_files([_doc(tmp_path, GOOD)], _registry(tmp_path))
    assert [(p.path.as_posix(), p.line) for p in problems] == [("docs/a.md", 3)]
    assert "stale" in problems[0].message


def test_a_claim_without_a_row_fails(tmp_path: Path) -> None:
    _rows(tmp_path / "benchmarks/results/x/r.jsonl", [_row("ours", 2.5), _row("peer", 4.0, status="oom")])
    problems = check_files([_doc(tmp_path, GOOD)], _registry(tmp_path))
    assert len(problems) == 1 and problems[0].line == 3
    assert "no row" in problems[0].message and "impl='peer'" in problems[0].message


def test_a_marker_naming_no_claim_fails(tmp_path: Path) -> None:
    problems = check_files([_doc(tmp_path, GOOD.replace("speed", "sped"))], _registry(tmp_path))
    assert len(problems) == 1 and "no claim named 'sped'" in problems[0].message


def test_a_ratio_of_two_commits_fails(tmp_path: Path) -> None:
    _rows(tmp_path / "benchmarks/results/x/r.jsonl", [_row("ours", 2.5), _row("peer", 4.0, sha="bbbb")])
    problems = check_files([_doc(tmp_path, GOOD)], _registry(tmp_path))
    assert len(problems) == 1 and "different commits" in problems[0].message
    with pytest.raises(ClaimError, match="different commits"):
        ratio(_row("a", 1.0), _row("b", 1.0, sha="cccc"))


def test_a_ratio_with_step_times_carries_its_interval() -> None:
    fast = _row("a", 1.0, times_ms=[1.0, 1.01, 0.99] * 5)
    slow = _row("b", 2.0, times_ms=[2.0, 2.02, 1.98] * 5)
    text = ratio(slow, fast)
    assert text.startswith("2.00x [") and not text.startswith("~")


def test_an_unclosed_block_fails(tmp_path: Path) -> None:
    problems = check_files([_doc(tmp_path, "<!-- claims: speed -->\n| x |\n")], _registry(tmp_path))
    assert len(problems) == 1 and problems[0].line == 1 and "never closed" in problems[0].message


@pytest.mark.parametrize("line, flagged", [
    ("The step takes 68.1 ms on xl.", True),
    ("It is 2.99x faster than HF.", True),
    ("MFU is 49.4 % of the peak.", True),
    ("The step takes 68.1 ms on xl ([rows](../benchmarks/results/fast/21/bench.jsonl)).", False),
    ("Target: 2.5x faster than HF.", False),
    ("batch 4, context 512, 16 heads, head dim 64", False),
    ("at most 2^27 score elements", False),
    ("Run `lmscope plan flops --step-ms 41.2`.", False),
])
def test_measured_looking_numbers_need_a_pointer_to_rows(tmp_path: Path, line: str, flagged: bool) -> None:
    problems = check_files([_doc(tmp_path, f"# T\n\n{line}\n")], _registry(tmp_path))
    assert bool(problems) == flagged, problems
    if flagged:
        assert problems[0].line == 3 and "outside a generated block" in problems[0].message


def test_a_pointer_covers_its_list_item_only(tmp_path: Path) -> None:
    doc = "- 68.1 ms, see `benchmarks/results/fast/`;\n  and 73.0 ms too.\n- 2.99x faster.\n"
    problems = check_files([_doc(tmp_path, doc)], _registry(tmp_path))
    assert [p.line for p in problems] == [3]


def test_the_committed_docs_pass_the_check() -> None:
    """Every generated block in README, docs and the results READMEs is what the committed rows give."""
    script = load_script("benchmarks/claims.py", "claims_script")
    assert script.main(["--check"]) == 0
