"""Host-bound rows: a column in the tables, a note under them and in the report naming the points."""

from __future__ import annotations

import json
from pathlib import Path

from lmscope.cli import main
from lmscope.report.host_bound import host_bound_note
from lmscope.report.page.command import build_page
from lmscope.report.page.model import TableBlock, TextBlock
from lmscope.report.tables import build_table
from lmscope.running.runner import spec_fields


def _row(size: str, share: float | None, **extra) -> dict:
    busy = {} if share is None else {"gpu_busy_ms": share * 10.0, "gpu_busy_share": share,
                                     "host_bound": share < 0.8}
    return {"workload": "bench", "status": "ok", "size": size, "context_length": 128, "batch_size": 4,
            "mode": "train-step", "precision": "bf16", "attention": "sdpa", "median_ms": 10.0,
            "mean_ms": 10.0, "std_ms": 0.5, "times_ms": [10.0] * 5, "device_name": "NVIDIA H100",
            **busy, **extra}


ROWS = [_row("small", 0.41), _row("xl", 0.97)]
KEYS = spec_fields("bench")


def test_the_note_names_only_the_host_bound_points() -> None:
    note = host_bound_note(ROWS, KEYS)
    assert note is not None
    assert "size=small (0.41 busy)" in note and "xl" not in note
    assert "depend on the host" in note and "80%" in note
    assert host_bound_note([_row("xl", 0.97), _row("small", None)], KEYS) is None  # CPU rows: no flag


def test_the_latest_row_of_a_point_decides() -> None:
    """A point measured again (a resume) is judged by its newest row, as the table shows it."""
    assert host_bound_note([_row("small", 0.41), _row("small", 0.93)], KEYS) is None


def test_the_table_shows_the_busy_share_and_the_flag() -> None:
    header, rows = build_table(ROWS, KEYS)
    share, flag = header.index("gpu_busy_share"), header.index("host_bound")
    assert [r[flag] for r in rows] == [True, False]
    assert [r[share] for r in rows] == [0.41, 0.97]


def test_lmscope_table_prints_the_note(tmp_path: Path, capsys) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    main(["table", str(path)])
    out = " ".join(capsys.readouterr().out.split())
    assert "host-bound: size=small" in out and "depend on the host" in out


def test_the_report_section_says_so(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    _, (section,), _ = build_page([path])
    texts = [b.text for b in section.blocks if isinstance(b, TextBlock)]
    assert any("host-bound: size=small" in t for t in texts)
    table = next(b for b in section.blocks if isinstance(b, TableBlock))
    assert "host_bound" in table.header
