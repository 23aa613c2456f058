"""`lmscope report`: load one run (or two to compare), build the sections, write HTML and Markdown."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lmscope.report import console
from lmscope.report.page.build import command_lines, run_sections
from lmscope.report.page.compare import compare_section
from lmscope.report.page.html import render_html
from lmscope.report.page.load import load_run
from lmscope.report.page.markdown import render_markdown
from lmscope.report.page.model import PageSection


def build_page(paths: Sequence[Path]) -> tuple[str, list[PageSection], list[str]]:
    """Title, sections and intro lines of the report of `paths` (two runs: the comparison first)."""
    if not paths:
        raise ValueError("give a run folder or a results.jsonl (two to compare)")
    if len(paths) > 2:
        raise ValueError(f"give one run, or two to compare; got {len(paths)}")
    runs = [load_run(Path(p)) for p in paths]
    if len(runs) == 2 and runs[0].label == runs[1].label:
        runs[0].label, runs[1].label = f"A:{runs[0].label}", f"B:{runs[1].label}"
    sections: list[PageSection] = []
    if len(runs) == 2:
        sections.append(compare_section(runs[0], runs[1]))
    for run in runs:
        for section in run_sections(run):
            if len(runs) == 2:
                section.title = f"{run.label}: {section.title}"
            sections.append(section)
    title = "lmscope report: " + " vs ".join(r.label for r in runs)
    intro = [line for r in runs for line in [f"{r.label}: {len(r.records)} record(s) from {r.base}",
                                               *command_lines(r.manifest.get("commands", []))]]
    notes = [note for run in runs for note in run.notes]
    for note in notes:
        console.warn(note)
    return title, sections, intro + notes


def write_report(paths: Sequence[Path], output: Path | None) -> tuple[Path, Path]:
    """Write the HTML report and its Markdown twin; return both paths."""
    title, sections, intro = build_page(paths)
    first = Path(paths[0])
    html_path = output or ((first if first.is_dir() else first.parent) / "report.html")
    if html_path.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"-o {html_path}: the report is HTML, give a path ending in .html")
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(render_html(title, sections, intro), encoding="utf-8")
    md_path = html_path.with_suffix(".md")
    md_path.write_text(render_markdown(title, sections, md_path, intro), encoding="utf-8")
    console.say(f"wrote {html_path} and {md_path}")
    return html_path, md_path
