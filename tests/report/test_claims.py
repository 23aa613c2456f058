"""The claims check: generated blocks from rows, stale blocks, missing rows, mixed commits, prose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripts import load_script

from lmscope.report.claims import ClaimError, Registry, Rows, Scope, check_files, fmt, ratio, table


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


def test_a_ratio_of_pooled_rounds_resamples_the_rounds() -> None:
    """Rows that pooled rounds (`lmscope.report.rounds.pool_rounds`) get the round-level interval:
    none from two rounds, however many steps each holds; one that holds both rounds with three."""
    def pooled(impl: str, ms: float, rounds: int) -> dict:
        by_round = [[ms * (1 + 0.05 * r) + 0.001 * i for i in range(15)] for r in range(rounds)]
        return _row(impl, ms, times_ms=sum(by_round, []), times_ms_by_round=by_round)

    two = ratio(pooled("b", 2.0, 2), pooled("a", 1.0, 2))
    assert two.endswith("(no interval: 2 rounds on one side, need 3)")
    text = ratio(pooled("b", 2.0, 3), pooled("a", 1.0, 3))
    low, high = (float(x) for x in text.split("[")[1].rstrip("]").split(", "))
    assert low < high


def test_an_unclosed_block_fails(tmp_path: Path) -> None:
    problems = check_files([_doc(tmp_path, "<!-- claims: speed -->\n| x |\n")], _registry(tmp_path))
    assert len(problems) == 1 and problems[0].line == 1 and "never closed" in problems[0].message


RUN = "benchmarks/results/x/r.jsonl"
"""The rows the prose tests link (from docs/a.md: ../benchmarks/results/x/r.jsonl)."""
LINK = f"([rows](../{RUN}))"


@pytest.mark.parametrize("line, flagged", [
    ("The step takes 68.1 ms on xl.", True),
    ("It is 2.99x faster than HF.", True),
    ("MFU is 49.4 % of the peak.", True),
    (f"The step takes 68.1 ms on xl {LINK}.", False),
    ("Target: 2.5x faster than HF.", False),
    ("batch 4, context 512, 16 heads, head dim 64, on 2x H200", False),
    ("at most 2^27 score elements", False),
    ("Run `lmscope plan flops --step-ms 41.2`.", False),
    ("The stage's tests were cut by its 100 s limit.", False),
    ("fp16 gives 9.953125 for a thousand 0.01s.", False),
    ("The step is host-bound: 68.2 ms.", True),
    ("The step is bound by the host: 68.2 ms.", True),
    ("The test bounds the error at 15 %.", False),
])
def test_measured_looking_numbers_need_a_pointer_to_rows(tmp_path: Path, line: str, flagged: bool) -> None:
    _rows(tmp_path / RUN, [_row("ours", 68.14)])
    problems = check_files([_doc(tmp_path, f"# T\n\n{line}\n")], _registry(tmp_path))
    assert bool(problems) == flagged, problems
    if flagged:
        assert problems[0].line == 3 and "outside a generated block" in problems[0].message


def test_a_pointer_covers_its_list_item_only(tmp_path: Path) -> None:
    _rows(tmp_path / RUN, [_row("ours", 68.1), _row("peer", 73.0)])
    doc = f"- 68.1 ms, see `{RUN}`;\n  and 73.0 ms too.\n- 73.0 ms as well.\n"
    problems = check_files([_doc(tmp_path, doc)], _registry(tmp_path))
    assert [p.line for p in problems] == [3]


README_PARAGRAPH = "The fast step takes {} on xl, see [its rows]({}).\n"


def test_an_unbacked_number_in_a_readme_paragraph_that_links_its_rows_fails(tmp_path: Path) -> None:
    """A paragraph that links a results file no longer vouches for every number in it."""
    _rows(tmp_path / RUN, [_row("ours", 68.14, forward_ms=20.2), _row("peer", 203.3)])
    readme = tmp_path / "README.md"
    readme.write_text("# lmscope\n\n" + README_PARAGRAPH.format("61.5 ms", RUN))
    problems = check_files([readme], _registry(tmp_path))
    assert [(p.path.as_posix(), p.line) for p in problems] == [("README.md", 3)]
    assert "'61.5 ms' is not within rounding" in problems[0].message and RUN in problems[0].message


@pytest.mark.parametrize("number, backed", [
    ("68.1 ms", True),      # median_ms 68.14, to one decimal
    ("68.14 ms", True),
    ("68 ms", True),
    ("68.2 ms", False),     # 68.14 rounds to 68.1
    ("68.15 ms", False),
    ("0.0681 s", True),     # the same field in seconds
    ("68.1 GiB", False),    # a time field backs no memory
    ("20.2 ms", True),      # forward_ms
    ("49.4 %", True),       # mfu 0.4937 as a percentage
    ("49.3 %", False),
    ("1.5 GiB", True),      # 1536 MiB
    ("2.99x", False),       # a ratio whose operands are not printed beside it
])
def test_a_number_passes_when_it_lies_within_rounding_of_a_linked_row(tmp_path: Path, number: str,
                                                                     backed: bool) -> None:
    _rows(tmp_path / RUN, [_row("ours", 68.14, forward_ms=20.2, mfu=0.4937, saved_mib=1536.0),
                           _row("peer", 203.3)])
    readme = tmp_path / "README.md"
    readme.write_text(README_PARAGRAPH.format(number, RUN))
    assert (check_files([readme], _registry(tmp_path)) == []) == backed


@pytest.mark.parametrize("sentence, backed", [
    ("HF takes 203.3 ms and fast 68.1 ms: 2.99x.", True),
    ("| xl | 203.3 | 68.1 | 2.99x |", True),
    ("HF takes 203.3 ms and fast 68.1 ms: 3.05x.", False),
    ("HF takes 203.5 ms and fast 68.1 ms: 2.99x.", False),  # an operand no row holds
    ("HF takes 203.3 ms. Fast takes 68.1 ms: 2.99x.", False),  # operands in two sentences
])
def test_a_ratio_passes_as_the_quotient_of_two_backed_numbers_beside_it(tmp_path: Path, sentence: str,
                                                                       backed: bool) -> None:
    _rows(tmp_path / RUN, [_row("ours", 68.14), _row("peer", 203.3)])
    doc = _doc(tmp_path, f"Rows: `{RUN}`.\n{sentence}\n")
    assert (check_files([doc], _registry(tmp_path)) == []) == backed


@pytest.mark.parametrize("target, broken", [
    ("b.md", False),
    ("b.md#a-heading", False),
    ("../docs/", False),
    ("b.md#no-such-heading", True),
    ("missing.md", True),
    ("{D}/ddp.jsonl", True),
    ("https://example.com/missing.md", False),
])
def test_a_relative_link_must_resolve(tmp_path: Path, target: str, broken: bool) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# A heading\n")
    problems = check_files([_doc(tmp_path, f"# T\n\nSee [there]({target}).\n")], _registry(tmp_path))
    assert [p.line for p in problems] == ([3] if broken else []), problems


@pytest.mark.parametrize("heading, anchor", [
    ("## The `gpu_busy_share` field", "the-gpu_busy_share-field"),  # GitHub keeps `_` of a code span
    ("## *Emphasis*, _more_ and **bold**", "emphasis-more-and-bold"),
    ("## snake_case, [a link](x.md) and `<name>`", "snake_case-a-link-and-name"),
])
def test_an_anchor_is_github_s_slug_of_its_heading(tmp_path: Path, heading: str, anchor: str) -> None:
    from lmscope.report.doc_refs import slugs

    (tmp_path / "b.md").write_text(f"# Title\n\n{heading}\n\n{heading}\n")
    assert slugs(tmp_path / "b.md") == {"title", anchor, f"{anchor}-1"}


def test_a_link_whose_text_wraps_is_checked_on_the_line_of_its_target(tmp_path: Path) -> None:
    doc = _doc(tmp_path, "# T\n\nSee [the two\nfiles](missing.md) and `[x](also-missing.md)` (code).\n")
    problems = check_files([doc], _registry(tmp_path))
    assert [(p.line, "'missing.md'" in p.message) for p in problems] == [(4, True)]


@pytest.mark.parametrize("reference, backed", [
    ("`benchmarks/results/x/<run>.jsonl`", True),   # <run> stands for any name: both files
    ("`benchmarks/results/x/a.jsonl`", False),      # 203.3 is in b.jsonl only
    ("`benchmarks/results/x/`", True),              # a folder: the rows files in it
    ("`benchmarks/results/y/`", False),             # no such folder
])
def test_a_reference_names_the_rows_of_every_file_it_matches(tmp_path: Path, reference: str,
                                                            backed: bool) -> None:
    _rows(tmp_path / "benchmarks/results/x/a.jsonl", [_row("ours", 68.14)])
    _rows(tmp_path / "benchmarks/results/x/b.jsonl", [_row("peer", 203.3)])
    doc = _doc(tmp_path, f"Ours 68.1 ms, HF 203.3 ms ({reference}).\n")
    assert (check_files([doc], _registry(tmp_path)) == []) == backed


def test_a_summary_number_with_no_backing_fails(tmp_path: Path) -> None:
    """A summary.md that no script writes is checked against the rows beside it, per section."""
    folder = tmp_path / "benchmarks/results/x"
    _rows(folder / "r.jsonl", [_row("ours", 68.14), _row("peer", 203.3)])
    summary = folder / "summary.md"
    summary.write_text("# run\n\n| impl | ms |\n|---|---|\n| ours | 68.1 ms |\n| peer | 204.0 ms |\n")
    problems = check_files([summary], _registry(tmp_path), scope=lambda path: Scope(by_section=True,
                                                                                  rows_beside=True))
    assert [p.line for p in problems] == [6] and "'204.0 ms'" in problems[0].message


def test_a_summary_its_script_writes_must_be_that_script_output(tmp_path: Path) -> None:
    """The claims script regenerates a summary.md from the rows beside it; a number edited in
    it fails, and --write puts the script's text back."""
    script = load_script("benchmarks/claims.py", "claims_script")
    folder = tmp_path / "benchmarks/results/own_model"
    folder.mkdir(parents=True)
    source = script.ROOT / "benchmarks/results/own_model"
    for name in ("bench.jsonl", "summary.md"):
        (folder / name).write_text((source / name).read_text())
    summary = folder / "summary.md"
    rows = summary.read_text().split("\n")
    at = next(i for i, line in enumerate(rows) if line.startswith("| hf:gpt2 |"))
    edited = summary.read_text().replace(rows[at], rows[at].replace("| 67.74 |", "| 61.00 |"))
    assert edited != summary.read_text()
    summary.write_text(edited)
    registry = Registry(tmp_path)
    problems = check_files([summary], registry, scope=lambda path: script.scope(path, tmp_path))
    assert [p.line for p in problems] == [at + 1] and "not what its script writes" in problems[0].message
    assert check_files([summary], registry, write=True, scope=lambda path: script.scope(path, tmp_path)) == []
    assert "| 67.74 |" in summary.read_text().split("\n")[at]


def test_the_committed_docs_pass_the_check() -> None:
    """Every generated block in README, docs and the results READMEs is what the committed rows give."""
    script = load_script("benchmarks/claims.py", "claims_script")
    assert script.main(["--check"]) == 0


def test_a_ratio_of_rows_with_empty_times_falls_back_to_the_medians() -> None:
    assert ratio(_row("b", 3.0, times_ms=[]), _row("a", 1.5, times_ms=[1.5] * 6)) == "2.00x"
