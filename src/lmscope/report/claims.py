"""Claims generated from committed result rows, and the check that docs quote no other numbers.

A doc holds a generated block between ``<!-- claims: NAME -->`` and ``<!-- /claims -->``; NAME
is a function registered in a `Registry` that reads JSONL rows and returns the block's markdown.
`check_files` re-renders every block and reports, by file and line:

- a block whose text differs from what its rows give (stale), a name with no claim, a claim whose
  query finds no row, a ratio of rows from two commits;
- a doc that a script writes whole from its rows (a summary.md, `Scope.regenerate`) and that
  differs from what the script writes now;
- a relative link that resolves to no file or folder, or to no heading of a markdown file
  (`lmscope.report.doc_refs`);
- a measured-looking number (a number with a unit: ms, s, us, %, x, GiB, MiB, GB/s, TB/s,
  TFLOP/s, tokens/s) outside any block that the rows its unit of text refers to do not back:
  within rounding of a value of those rows, or for a ratio the quotient of two such numbers
  printed beside it (`lmscope.report.backing`). The unit of text is the paragraph, list item or
  table (with the paragraph above it), or in a results README the section; it refers to rows by
  a link, a code span or a ``benchmarks/results/`` path (`doc_refs.rows_files`), and a results
  README also to the rows beside it. Not checked: a clause (up to a semicolon or sentence end,
  or a table cell) with a word of a requirement or a setting (target, at most, default, limit,
  ...), code, and a paragraph that names the ``lmscope plan`` command (a prediction it
  computes, not a measurement).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmscope.records.provenance import code_identity, source_label
from lmscope.report.backing import Backing, numbers, parse
from lmscope.report.doc_refs import ROWS_SUFFIXES, broken, links, rows_files
from lmscope.report.rounds import ratio_between

Row = dict[str, Any]

OPEN = re.compile(r"^<!-- claims: ([A-Za-z0-9_.-]+) -->\s*$")
CLOSE = "<!-- /claims -->"

MEASURED = re.compile(
    r"(?<![\w.^/,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
    r"(?:x(?!\s?[A-Z]\d)|\s?(?:ms|us|µs|μs|%|GiB|MiB|GB/s|TB/s|TFLOP/s|tokens/s)| s)(?![\w^/])"
)
"""A number with a unit that a measurement gives; `2^27` or `x/y` formula text, a count of GPUs
(`2x H200`), a plural (`0.01s`: seconds take a space) and a bare count do not match."""

PREDICTION = re.compile(r"lmscope plan ")
"""The command that computes a number (a prediction, not a measurement): its paragraph is not
checked against rows."""

CONSTANT = re.compile(r"\b(?:targets?|goal|must|at most|at least|tolerance|slack|budget|default"
                      r"|e\.g\.|interval|confidence|catalog|datasheet|example|predict\w*|limits?|timeouts?)\b"
                      r"|(?<![\w-])bounds?\b(?! by)|>=|<=|[≥≤<>]", re.IGNORECASE)
"""Words that make a number on the same clause a requirement or a setting, not a measurement
("bounds the error at", not "host-bound" or "bound by the host")."""


class ClaimError(Exception):
    """A claim's query found no row, more than one where one was asked, or mixed two runs."""


@dataclass(frozen=True)
class Problem:
    """One finding of the check: where, and what is wrong."""

    path: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class Registry:
    """Claims by name; each renders its block from the rows under `root`."""

    root: Path
    claims: dict[str, Callable[[Rows], str]] = field(default_factory=dict)

    def claim(self, name: str) -> Callable[[Callable[[Rows], str]], Callable[[Rows], str]]:
        """Decorator registering `fn(rows) -> markdown` as the claim NAME."""

        def register(fn: Callable[[Rows], str]) -> Callable[[Rows], str]:
            if name in self.claims:
                raise ValueError(f"claim {name!r} is defined twice: give each claim its own name")
            self.claims[name] = fn
            return fn

        return register

    def render(self, name: str) -> str:
        """The block text of claim NAME, ending in a newline."""
        try:
            text = self.claims[name](Rows(self.root)).rstrip("\n")
        except KeyError as exc:
            raise ClaimError(f"a row it reads has no field {exc}") from exc
        return text + "\n"


class Rows:
    """Committed JSONL rows under a repository root, read once per file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[Path, list[Row]] = {}

    def load(self, pattern: str) -> list[Row]:
        """Rows of every JSONL (or CSV) file matching the glob `pattern` (relative to root), each
        with `_file`; CSV values stay strings."""
        paths = sorted(self.root.glob(pattern))
        if not paths:
            raise ClaimError(f"no file matches {pattern}")
        out: list[Row] = []
        for path in paths:
            if path not in self._cache:
                rel = path.relative_to(self.root).as_posix()
                with path.open() as f:
                    if path.suffix == ".csv":
                        self._cache[path] = [dict(row, _file=rel) for row in csv.DictReader(f)]
                    else:
                        self._cache[path] = [dict(json.loads(line), _file=rel) for line in f if line.strip()]
            out.extend(self._cache[path])
        return out

    def select(self, pattern: str, **filters: Any) -> list[Row]:
        """Rows of `pattern` whose fields equal `filters` (status ok unless given); none is an error."""
        filters.setdefault("status", "ok")
        rows = [r for r in self.load(pattern) if all(r.get(k) == v for k, v in filters.items())]
        if not rows:
            raise ClaimError(f"no row in {pattern} with {_describe(filters)}")
        return rows

    def one(self, pattern: str, **filters: Any) -> Row:
        """The single row of `pattern` matching `filters`."""
        rows = self.select(pattern, **filters)
        if len(rows) > 1:
            raise ClaimError(f"{len(rows)} rows in {pattern} with {_describe(filters)}; add a filter")
        return rows[0]


def same_run(*rows: Row) -> str:
    """The code identity (source hash, else git sha) shared by `rows`; a ClaimError when they come
    from different code."""
    shas = {code_identity(r) for r in rows}
    if len(shas) != 1 or None in shas:
        raise ClaimError(f"rows from different commits compared: {sorted(map(str, shas))}")
    return shas.pop()


def ratio(base: Row, other: Row, key: str = "median_ms", times: str | None = "times_ms") -> str:
    """base[key] / other[key] of two rows of one commit, with its bootstrap interval when both
    carry the per-step `times` (None: rows without them, e.g. do_bench medians). Rows that pooled
    rounds get the round-level interval (`lmscope.report.rounds.ratio_between`)."""
    same_run(base, other)
    interval = ratio_between(base, other, times) if times is not None else None
    if interval is not None:
        return interval.as_text()
    return f"{base[key] / other[key]:.2f}x"


def fmt(value: float | None, digits: int = 3) -> str:
    """A number to `digits` significant figures (no exponent below 1e6); '-' for None."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    text = f"{value:#.{digits}g}".rstrip(".")
    if "e" in text:
        text = f"{value:.0f}" if abs(value) >= 1 else f"{value:.{digits + 3}f}".rstrip("0")
    return text


def table(headers: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def claim_block(caption: str, table_text: str, *footer: str) -> str:
    """A claim's text: its caption, a blank line, its table, a blank line, then the footer lines
    (where the rows were measured)."""
    return "\n".join([caption, "", table_text, "", *footer])


def provenance(rows: Sequence[Row]) -> str:
    """'device, source, date(s)' of rows that share one code identity (the source label names the
    commit, a declared one with the source hash that checks it)."""
    same_run(*rows)
    sha = source_label(rows[0])
    devices = sorted({str(r.get("device_name")) for r in rows})
    days = sorted({str(r.get("time", ""))[:10] for r in rows})
    when = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    links = ", ".join(f"`{f}`" for f in sorted({r["_file"] for r in rows}))
    return f"{', '.join(devices)}, git {sha}, {when}; rows: {links}"


def blocks(text: str) -> list[tuple[str, int, int]]:
    """(name, open line index, close line index) of each generated block; errors as ValueError."""
    lines = text.split("\n")
    found: list[tuple[str, int, int]] = []
    start: tuple[str, int] | None = None
    for i, line in enumerate(lines):
        match = OPEN.match(line.strip())
        if match:
            if start is not None:
                raise ValueError(f"{i + 1}: block opened inside block {start[0]!r} (line {start[1] + 1})")
            start = (match.group(1), i)
        elif line.strip() == CLOSE:
            if start is None:
                raise ValueError(f"{i + 1}: {CLOSE} without an opening marker")
            found.append((start[0], start[1], i))
            start = None
    if start is not None:
        raise ValueError(f"{start[1] + 1}: block {start[0]!r} is never closed with {CLOSE}")
    return found


@dataclass(frozen=True)
class Scope:
    """How the prose of one doc finds the rows behind its numbers."""

    by_section: bool = False
    """A reference to rows anywhere under a heading covers the whole section (a results README,
    whose sections each describe rows beside it)."""
    rows_beside: bool = False
    """The rows files in the doc's own folder back its numbers (a results README)."""
    regenerate: Callable[[], str] | None = None
    """For a doc a script writes whole from its rows (a summary.md): that script's text now. The
    doc must equal it; its numbers are then the script's, and its prose is not scanned."""


class Evidence:
    """The rows of the files a piece of prose refers to, indexed once per set of files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._rows = Rows(root)
        self._index: dict[frozenset[Path], Backing] = {}

    def backing(self, files: frozenset[Path]) -> Backing:
        """The Backing of every row of `files` (paths under the root)."""
        if files not in self._index:
            rows = [r for f in sorted(files) for r in self._rows.load(f.relative_to(self.root).as_posix())]
            self._index[files] = Backing.of(rows)
        return self._index[files]


def process(path: Path, registry: Registry, write: bool, display: Path | None = None,
            scope: Scope = Scope(), evidence: Evidence | None = None) -> list[Problem]:
    """Check (or rewrite) the generated blocks of one file, then its links and its prose."""
    shown = display or path
    text = path.read_text()
    if scope.regenerate is not None:
        return regenerated(path, text, scope.regenerate(), shown, write) + broken_links(path, text, shown)
    try:
        found = blocks(text)
    except ValueError as exc:
        line, message = str(exc).split(": ", 1)
        return [Problem(shown, int(line), message)]
    lines = text.split("\n")
    problems: list[Problem] = []
    out: list[str] = []
    last = 0
    for name, begin, end in found:
        out += lines[last : begin + 1]
        current = "\n".join(lines[begin + 1 : end]) + ("\n" if end > begin + 1 else "")
        new = current
        if name not in registry.claims:
            problems.append(Problem(shown, begin + 1, f"no claim named {name!r} in the claims script"))
        else:
            try:
                new = registry.render(name)
            except ClaimError as exc:
                problems.append(Problem(shown, begin + 1, f"claim {name!r}: {exc}"))
            else:
                if new != current and not write:
                    problems.append(Problem(shown, begin + 1,
                                            f"claim {name!r} is stale: its rows give other text "
                                            "(run python benchmarks/claims.py --write)"))
        kept = new if write else current
        if kept:
            out += kept.rstrip("\n").split("\n")
        last = end
    out += lines[last:]
    if write:
        new_text = "\n".join(out)
        if new_text != text:
            path.write_text(new_text)
    problems += broken_links(path, text, shown)
    problems += unbacked(path, text, found, shown, scope, evidence or Evidence(registry.root))
    return problems


def regenerated(path: Path, text: str, expected: str, shown: Path, write: bool) -> list[Problem]:
    """A doc its script writes whole: rewritten (`write`) or checked against the script's text."""
    if text == expected:
        return []
    if write:
        path.write_text(expected)
        return []
    old, new = text.split("\n"), expected.split("\n")
    differ = [i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b]
    line = differ[0] if differ else min(len(old), len(new))
    return [Problem(shown, line + 1, "not what its script writes from the rows beside it "
                                     "(run python benchmarks/claims.py --write)")]


def broken_links(path: Path, text: str, shown: Path) -> list[Problem]:
    """Relative links of the doc that resolve to nothing."""
    return [Problem(shown, i + 1, why) for i, target in links(text.split("\n"))
            if (why := broken(path, target)) is not None]


def unbacked(path: Path, text: str, found: Sequence[tuple[str, int, int]], shown: Path, scope: Scope,
             evidence: Evidence) -> list[Problem]:
    """Measured-looking numbers outside blocks that no row their unit of text refers to backs."""
    lines = text.split("\n")
    inside = set()
    for _, begin, end in found:
        inside.update(range(begin, end + 1))
    beside = frozenset(p.resolve() for p in path.parent.iterdir()
                       if p.is_file() and p.suffix in ROWS_SUFFIXES) if scope.rows_beside else frozenset()
    problems = []
    for unit in (_sections if scope.by_section else _units)(lines, inside):
        body = "\n".join(lines[i] for i in unit)
        if PREDICTION.search(body):
            continue
        hits = _measured(body)
        if not hits:
            continue
        files = frozenset(rows_files(path, body, evidence.root)) | beside
        backing = evidence.backing(files) if files else None
        flagged: dict[int, list[str]] = {}
        for offset, hit, context in hits:
            if backing is None or not backing.backs(parse(hit), numbers(context)):
                flagged.setdefault(unit[offset], []).append(hit)
        for i, unbacked_here in sorted(flagged.items()):
            what = ", ".join(repr(n) for n in unbacked_here)
            if backing is None:
                message = f"measured-looking {what} outside a generated block, with no reference to its rows"
            else:
                named = ", ".join(sorted(f.relative_to(evidence.root).as_posix() for f in files))
                message = (f"{what} is not within rounding of any value of the rows its text refers to "
                           f"({_shorten(named)}): generate it, refer to its rows, or drop it")
            problems.append(Problem(shown, i + 1, message))
    return problems


def _shorten(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _measured(text: str) -> list[tuple[int, str, str]]:
    """(line offset, number, its table row or sentence) of each measured-looking number in `text`
    whose sentence, clause (up to a semicolon) or table cell holds no word of a requirement or
    setting; code spans are skipped."""
    code_free = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), text)
    sentence_ends = [m.end() for m in re.finditer(r"[.!?]\s", code_free)]
    hits = []
    start = 0
    for end in [m.start() for m in re.finditer(r"[;|]|\.\s", code_free)] + [len(code_free)]:
        clause = code_free[start:end]
        if not CONSTANT.search(clause):
            for m in MEASURED.finditer(clause):
                at = start + m.start()
                line = code_free.count("\n", 0, at)
                hits.append((line, m.group(0), _context(code_free, at, sentence_ends)))
        start = end + 1
    return hits


def _context(text: str, at: int, sentence_ends: Sequence[int]) -> str:
    """The table row holding position `at` of `text`, else its sentence."""
    line_start = text.rfind("\n", 0, at) + 1
    line_end = len(text) if (e := text.find("\n", at)) < 0 else e
    if text[line_start:line_end].lstrip().startswith("|"):
        return text[line_start:line_end]
    before = [e for e in sentence_ends if e <= at]
    after = [e for e in sentence_ends if e > at]
    return text[before[-1] if before else 0 : after[0] if after else len(text)]


def _units(lines: Sequence[str], skip: set[int]) -> list[list[int]]:
    """Paragraphs, list items and tables (a table with the paragraph above it), outside code fences."""
    units: list[list[int]] = []
    current: list[int] = []
    fence = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = not fence
            if current:
                units.append(current)
                current = []
            continue
        if fence or i in skip or not stripped or stripped.startswith("#"):
            if current:
                units.append(current)
                current = []
            continue
        new_item = re.match(r"^\s*(?:[-*+]|\d+\.)\s", line) is not None
        starts_table = stripped.startswith("|") and current and not lines[current[-1]].strip().startswith("|")
        if new_item and current and not starts_table:
            units.append(current)
            current = []
        current.append(i)
    if current:
        units.append(current)
    return units


def _sections(lines: Sequence[str], skip: set[int]) -> list[list[int]]:
    """Lines under each heading, outside generated blocks."""
    units: list[list[int]] = [[]]
    for i, line in enumerate(lines):
        if line.startswith("#"):
            units.append([])
        if i not in skip:
            units[-1].append(i)
    return [u for u in units if u]


def _describe(filters: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in filters.items())


def check_files(paths: Iterable[Path], registry: Registry, write: bool = False,
                scope: Callable[[Path], Scope] = lambda path: Scope()) -> list[Problem]:
    """Problems of every file in `paths` (shown relative to the registry's root)."""
    problems: list[Problem] = []
    evidence = Evidence(registry.root)
    for path in paths:
        try:
            shown = path.relative_to(registry.root)
        except ValueError:
            shown = path
        problems += process(path, registry, write, shown, scope(path), evidence)
    return problems
