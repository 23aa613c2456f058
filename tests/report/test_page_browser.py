"""The report in a real browser: headless Chromium renders it, every image decodes, tables are there.

Skipped, saying why, where Chromium is not installed (Debian: `apt-get install chromium`).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from page_checks import PNG_MAGIC, check_page

from lmscope.report.page.command import write_report

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium is not installed "
    "(apt-get install -y chromium): the browser check of the report is skipped",
)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--no-first-run",
    "--virtual-time-budget=5000",
]


def _chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, *args], capture_output=True, text=True, timeout=timeout)


def test_chromium_renders_the_report_with_its_tables_and_images(tmp_path):
    bench = (RESULTS / "bench" / "bench.jsonl").read_text().splitlines()[::12][:10]
    comm = (RESULTS / "distributed" / "comm.jsonl").read_text().splitlines()[:8]
    (tmp_path / "results.jsonl").write_text("\n".join(bench + comm) + "\n")
    html_path, _ = write_report([tmp_path], tmp_path / "report.html")
    page = check_page(html_path.read_text())
    assert len(page.images) == 2

    dom = _chromium("--dump-dom", html_path.as_uri())
    assert dom.returncode == 0, dom.stderr[-500:]
    marker = re.search(r'data-images-ok="(\d+)/(\d+)"', dom.stdout)
    assert marker, "the page's load script did not run"
    assert marker.group(1) == marker.group(2) == str(len(page.images))
    assert dom.stdout.count("<table") == len(page.tables)
    assert dom.stdout.count("<tr>") >= sum(page.tables)

    shot = tmp_path / "report.png"
    result = _chromium(f"--screenshot={shot}", "--window-size=1280,1600", html_path.as_uri())
    assert result.returncode == 0 and shot.exists(), result.stderr[-500:]
    data = shot.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 20_000


def _sections(dom: str) -> dict[str, tuple[list[str], str]]:
    """Per rendered section: the header cells of its tables, and its text."""
    found = {}
    for part in dom.split('<section id="s')[1:]:
        title = re.search(r"<h2>(.*?)</h2>", part).group(1)
        heads = re.findall(r"<thead>(.*?)</thead>", part, re.S)
        cells = [cell for head in heads for cell in re.findall(r"<th[^>]*>(.*?)</th>", head)]
        found[title] = (cells, re.sub(r"<[^>]+>", " ", part))
    return found


def test_chromium_shows_the_cpu_studys_accounting_answer_and_every_sections_variables(tmp_path):
    """The committed CPU study (benchmarks/results/study-cpu), its report rendered by Chromium:
    the accounting's answer is on the page, said to be a prediction for its device, and each
    measured section's table has the columns of its question's variables."""
    study = RESULTS / "study-cpu"
    for path in [*study.glob("*.jsonl"), study / "study.json"]:
        shutil.copy(path, tmp_path / path.name)
    html_path, _ = write_report([tmp_path], tmp_path / "report.html")
    dom = _chromium("--dump-dom", html_path.as_uri())
    assert dom.returncode == 0, dom.stderr[-500:]
    sections = _sections(dom.stdout)
    header, text = sections["accounting"]
    assert {"model", "dp", "fsdp", "tp", "total_gib", "fits", "dp_step_mb", "forward_bound",
            "backward_comm_ms"} <= set(header)
    assert "Predictions for H100 SXM, not measurements" in text
    manifest = json.loads((study / "study.json").read_text())
    measured = [n for n, s in manifest["sections"].items() if not s["skip_reason"] and s["variables"]]
    assert len(measured) >= 8
    for name in measured:  # a column each, or (the precision checks' tables of rows) in the titles
        header, text = sections[name]
        for variable in manifest["sections"][name]["variables"]:
            assert variable in header or f"{variable}=" in text, (name, variable, header)
