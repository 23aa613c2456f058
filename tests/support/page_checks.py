"""Structural checks of a report page, shared by the report tests and the browser test."""

from __future__ import annotations

import base64
import struct
from html.parser import HTMLParser

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class PageParser(HTMLParser):
    """Collects tables (rows per table), images, attributes that could load something, titles."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[int] = []
        self.images: list[str] = []
        self.links: list[str] = []
        self.titles: list[str] = []
        self.open: list[str] = []
        self._in_body = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append(0)
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.tables[-1] += 1
        elif tag == "img":
            self.images.append(attrs.get("src") or "")
        if tag == "td" and attrs.get("title"):
            self.titles.append(attrs["title"])
        for name in ("src", "href", "action", "data"):
            if attrs.get(name):
                self.links.append(attrs[name])

    def handle_endtag(self, tag):
        if tag == "tbody":
            self._in_body = False


def png_size(src: str) -> tuple[int, int]:
    """Width and height of a data: PNG (fails on anything else)."""
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix), src[:40]
    data = base64.b64decode(src[len(prefix) :], validate=True)
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def check_page(text: str) -> PageParser:
    """Parse the page and assert it is self-contained, its tables have rows and its images are PNGs."""
    parser = PageParser()
    parser.feed(text)
    parser.close()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert parser.tables and all(rows > 0 for rows in parser.tables)
    for src in parser.images:
        width, height = png_size(src)
        assert width > 100 and height > 100
    external = [link for link in parser.links if not (link.startswith("data:") or link.startswith("#"))]
    assert external == []
    assert "<link" not in text and "http://" not in text.split("<body")[0]
    return parser
