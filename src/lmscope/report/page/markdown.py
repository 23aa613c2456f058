"""The report's Markdown twin: the same sections, images written as PNG files beside it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lmscope.report.page.model import Cell, ImageBlock, PageSection, TableBlock, TextBlock
from lmscope.report.tables import format_value


def _md_cell(value: object) -> str:
    text = value.text if isinstance(value, Cell) else format_value(value)
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(
    title: str, sections: Sequence[PageSection], path: Path, intro: Sequence[str] = ()
) -> str:
    """The Markdown text for `path`; images go to <stem>_files/ beside it."""
    folder = path.with_name(f"{path.stem}_files")
    out = [f"# {title}", "", *(f"{line}\n" for line in intro)]
    for index, section in enumerate(sections):
        out += [f"## {section.title}", "", f"*{section.question}*", ""]
        for block in section.blocks:
            if isinstance(block, TableBlock):
                out += [
                    f"**{block.title}**",
                    "",
                    "| " + " | ".join(map(str, block.header)) + " |",
                    "|" + "---|" * len(block.header),
                ]
                out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in block.rows]
                out.append("")
            elif isinstance(block, ImageBlock):
                folder.mkdir(parents=True, exist_ok=True)
                name = f"s{index}_{block.name}.png"
                (folder / name).write_bytes(block.png)
                out += [f"![{block.title}]({folder.name}/{name})", ""]
            elif isinstance(block, TextBlock):
                out += [block.text, ""]
        if section.provenance:
            out += ["```", *section.provenance, "```", ""]
    return "\n".join(out) + "\n"
