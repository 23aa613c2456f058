"""The report as one self-contained HTML file: inline CSS, inline JS, images as data: PNGs.

Nothing is fetched from the network. Tables sort when a header is clicked; shortened kernel names
keep the full name in a title (hover). A small script marks <body data-images-ok="N/M"> once the
page has loaded, so a headless browser can tell that every image decoded.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from typing import Any

from lmscope.report.page.model import Cell, ImageBlock, PageSection, TableBlock, TextBlock
from lmscope.report.tables import format_value

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:2em}
.q{font-style:italic;color:#444}table{border-collapse:collapse;font-size:12px;margin:.5em 0 1em}
th,td{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#f3f3f3;cursor:pointer;user-select:none}th.asc:after{content:" \\25B2"}
th.desc:after{content:" \\25BC"}td.t{text-align:left}td.bad{color:#b00}
.scroll{overflow-x:auto}img{max-width:100%;border:1px solid #eee}
.prov{font-size:11px;color:#666;white-space:pre-wrap}nav a{margin-right:1em}
"""

JS = """
function sortTable(th){const table=th.closest('table'),body=table.tBodies[0],i=th.cellIndex;
const asc=!th.classList.contains('asc');
table.querySelectorAll('th').forEach(h=>h.classList.remove('asc','desc'));
th.classList.add(asc?'asc':'desc');const key=td=>{const t=(td.dataset.v??td.textContent).trim();
const n=parseFloat(t.replace(/,/g,''));return isNaN(n)?t:n};
const rows=Array.from(body.rows);rows.sort((a,b)=>{const x=key(a.cells[i]),y=key(b.cells[i]);
if(typeof x==='number'&&typeof y==='number')return asc?x-y:y-x;return asc?String(x).localeCompare(String(y)):
String(y).localeCompare(String(x))});rows.forEach(r=>body.appendChild(r))}
document.querySelectorAll('th').forEach(th=>th.addEventListener('click',()=>sortTable(th)));
window.addEventListener('load',()=>{const imgs=Array.from(document.images);
const ok=imgs.filter(im=>im.complete&&im.naturalWidth>0).length;
document.body.setAttribute('data-images-ok',ok+'/'+imgs.length)});
"""

FAILED = {"OOM", "TIMEOUT", "ERROR"}


def _cell(value: Any) -> str:
    if isinstance(value, Cell):
        return f'<td class="t" title="{html.escape(value.full)}">{html.escape(value.text)}</td>'
    text = format_value(value)
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    cls = "bad" if text in FAILED else ("" if numeric else "t")
    data = f' data-v="{value!r}"' if numeric else ""
    return f'<td class="{cls}"{data}>{html.escape(text)}</td>'


def table_html(block: TableBlock) -> str:
    """A sortable table."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in block.header)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in block.rows)
    return (
        f"<h3>{html.escape(block.title)}</h3><div class=scroll><table><thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def image_html(block: ImageBlock) -> str:
    """An inline PNG."""
    data = base64.b64encode(block.png).decode("ascii")
    return (
        f"<h3>{html.escape(block.title)}</h3>"
        f'<img alt="{html.escape(block.title)}" src="data:image/png;base64,{data}">'
    )


def render_html(title: str, sections: Sequence[PageSection], intro: Sequence[str] = ()) -> str:
    """The whole page."""
    nav = "".join(f'<a href="#s{i}">{html.escape(s.title)}</a>' for i, s in enumerate(sections))
    parts = [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>",
        *(f"<p>{html.escape(line)}</p>" for line in intro),
        f"<nav>{nav}</nav>",
    ]
    for index, section in enumerate(sections):
        parts.append(
            f'<section id="s{index}"><h2>{html.escape(section.title)}</h2>'
            f"<p class=q>{html.escape(section.question)}</p>"
        )
        for block in section.blocks:
            if isinstance(block, TableBlock):
                parts.append(table_html(block))
            elif isinstance(block, ImageBlock):
                parts.append(image_html(block))
            elif isinstance(block, TextBlock):
                parts.append(f"<p>{html.escape(block.text)}</p>")
        if section.provenance:
            parts.append(f"<div class=prov>{html.escape(chr(10).join(section.provenance))}</div>")
        parts.append("</section>")
    parts.append(f"<script>{JS}</script></body></html>")
    return "\n".join(parts)
