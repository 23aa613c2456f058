"""What a markdown doc refers to: its relative links (do they resolve?) and the rows its prose names.

A *link* is ``[text](target)`` (images too); a relative one must name a file or folder that
exists, relative to the doc, and an ``#anchor`` into a markdown file must name one of its
headings (GitHub's slugs). A *reference to rows* is a link, a code span or a bare
``benchmarks/results/...`` path that resolves (relative to the doc, else to the repository root)
to a results file or folder: a ``.jsonl`` or ``.csv`` file names its own rows, another file
(a summary, a log, a README) or a folder the rows files directly in its folder. ``<name>`` in a
path stands for any name (``fsdp-<size>-x2.jsonl``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path

ROWS_SUFFIXES = (".jsonl", ".csv")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE = re.compile(r"`([^`\n]+)`")
BARE = re.compile(r"(?<![\w/`])(benchmarks/results/[\w.<>*/+-]+)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
PLACEHOLDER = re.compile(r"<[^<>/]+>")


def links(lines: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(line index, target) of each markdown link outside code fences and code spans; a link's
    text may wrap across lines."""
    fence = False
    prose = []
    for line in lines:
        if line.strip().startswith("```"):
            fence = not fence
            prose.append("")
        else:
            prose.append("" if fence else CODE.sub(lambda m: " " * len(m.group(0)), line))
    text = "\n".join(prose)
    for match in LINK.finditer(text):
        yield text.count("\n", 0, match.start(1)), match.group(1)


def broken(doc: Path, target: str) -> str | None:
    """Why the link `target` of `doc` does not resolve; None when it does (or is external)."""
    if EXTERNAL.match(target):
        return None
    path_part, _, anchor = target.partition("#")
    path = (doc.parent / path_part).resolve() if path_part else doc.resolve()
    if not path.exists():
        return f"link target {path_part!r} does not exist"
    if anchor and path.suffix == ".md" and anchor.lower() not in slugs(path):
        return f"link target {target!r}: no heading with anchor #{anchor}"
    return None


@cache
def slugs(path: Path) -> frozenset[str]:
    """GitHub's anchors of the headings of a markdown file (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    fence = False
    for line in path.read_text().split("\n"):
        if line.strip().startswith("```"):
            fence = not fence
        if fence or not re.match(r"^#{1,6}\s", line):
            continue
        text = _heading_text(line.lstrip("#").strip())
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(out)


def _heading_text(heading: str) -> str:
    """A heading's text as GitHub renders it: code spans verbatim (`_` and all); outside them no
    emphasis marks (an underscore inside a word is none), HTML tags or link targets."""
    out = []
    for part in re.split(r"(`[^`]*`)", heading):
        if len(part) >= 2 and part[0] == part[-1] == "`":
            out.append(part[1:-1])
        else:
            part = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", part)
            out.append(re.sub(r"\*|<[^>]+>|(?<!\w)_+|_+(?!\w)", "", part))
    return "".join(out)


def references(text: str) -> list[str]:
    """Link targets, code spans and bare results paths of `text` that could name a path."""
    found = [m.group(1) for m in LINK.finditer(text)]
    found += [m.group(1).strip() for m in CODE.finditer(text)]
    found += [m.group(1) for m in BARE.finditer(CODE.sub(" ", text))]
    return [ref.rstrip(".,;:)") for ref in found if "/" in ref or ref.endswith(ROWS_SUFFIXES)]


def rows_files(doc: Path, text: str, root: Path) -> set[Path]:
    """The rows files (JSONL, CSV) that `text`, prose of `doc`, refers to (module docstring)."""
    out: set[Path] = set()
    results = (root / "benchmarks" / "results").resolve()
    for ref in references(text):
        if EXTERNAL.match(ref) or " " in ref:
            continue
        pattern = PLACEHOLDER.sub("*", ref.split("#")[0])
        for base in (doc.parent, root):
            hits = _glob(base.resolve(), pattern)
            if hits:
                break
        for hit in hits:
            if hit.is_file() and hit.suffix in ROWS_SUFFIXES:
                out.add(hit)
            elif results in hit.parents or hit == results:
                folder = hit if hit.is_dir() else hit.parent
                out.update(p for p in folder.iterdir() if p.is_file() and p.suffix in ROWS_SUFFIXES)
    return out


def _glob(base: Path, pattern: str) -> list[Path]:
    """Existing paths under `base` matching `pattern` (a path, `*` standing for any name)."""
    parts = [p for p in pattern.split("/") if p not in ("", ".")]
    while parts and parts[0] == "..":
        base, parts = base.parent, parts[1:]
    if not parts:
        return []
    if "*" not in pattern:
        path = base.joinpath(*parts)
        return [path.resolve()] if path.exists() else []
    return sorted(p.resolve() for p in base.glob("/".join(parts)))
