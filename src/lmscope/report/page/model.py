"""What a report page holds: sections of one question each, made of tables, images and text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cell:
    """A table cell shown short, with its full text on hover (kernel names)."""

    text: str
    full: str


@dataclass(frozen=True)
class TableBlock:
    """A sortable table; cells are values or `Cell`s."""

    title: str
    header: list[str]
    rows: list[list[Any]]


@dataclass(frozen=True)
class ImageBlock:
    """A PNG picture (inline in HTML, a file beside the Markdown)."""

    title: str
    name: str
    png: bytes


@dataclass(frozen=True)
class TextBlock:
    """A paragraph."""

    text: str


Block = TableBlock | ImageBlock | TextBlock


@dataclass
class PageSection:
    """One question, its blocks, and where the numbers came from."""

    title: str
    question: str
    blocks: list[Block] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)
