"""Every lmscope command in README.md and docs/**/*.md goes through the CLI on the CPU as written.

The command exactly as written passes the CLI's flag checks and point planning
(LMSCOPE_PLAN_ONLY=1; `study` has --plan-only) and prints its plan, so a renamed flag, a removed
preset or a bad value in the docs fails here. A command that needs a GPU gets to its plan or is
refused in one line (REFUSED_ON_CPU). `table` and `report` read what an earlier run wrote, so
they are left to their own tests (tests/cli, tests/report). The points themselves are run on the
CPU by the command tests (tests/workloads, tests/cli).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from lmscope.cli import main
from lmscope.sources.preset import FLASH_ON_CPU

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*```(\w*)")
SHELL = ("", "bash", "sh", "shell", "console")
COMMENT = re.compile(r"\s+#.*$")
RUNS_LMSCOPE = re.compile(r"(^|\s)(lmscope|-m lmscope[\w.]*|benchmarks/claims\.py)\s")
LAUNCHER = re.compile(
    r"^(?:\w+=\S+\s+)*(?:uv run\s+)?(?:lmscope|python3? -m lmscope|torchrun .*?-m lmscope)\s")


@dataclass(frozen=True)
class DocCommand:
    """One command line of a fenced block: where it is, and its text (continuations joined,
    trailing comment dropped)."""

    where: str
    text: str

    @property
    def argv(self) -> list[str]:
        """The words after `lmscope` (`uv run`, `python -m` and torchrun's launch left out), with
        the STAND_INS for the user's own names."""
        text = LAUNCHER.sub("", self.text, count=1)
        for name, (stand_in, _) in STAND_INS.items():
            text = text.replace(name, stand_in)
        return shlex.split(text)

    @property
    def command(self) -> str:
        return self.argv[0] if self.argv else ""


def doc_commands() -> list[DocCommand]:
    """Every command line in a fenced shell block of the docs, one per `&&` part."""
    found = []
    for path in DOCS:
        inside, pending, start = None, "", 0
        for number, line in enumerate(path.read_text().splitlines(), 1):
            fence = FENCE.match(line)
            if fence:
                inside, pending = (fence.group(1) if inside is None else None), ""
                continue
            if inside not in SHELL:
                continue
            start = start if pending else number
            pending = f"{pending} {line.strip()}".strip()
            if pending.endswith("\\"):
                pending = pending[:-1].rstrip()
                continue
            for part in COMMENT.sub("", pending).split("&&"):
                found.append(DocCommand(f"{path.relative_to(ROOT)}:{start}", part.strip()))
            pending = ""
    return [c for c in found if RUNS_LMSCOPE.search(c.text + " ")]


NOT_RUN = {
    "benchmarks/claims.py": "runs in CI already: tests/report/test_claims.py runs claims.py --check "
                            "(--write is the same code writing the blocks it checks)",
    "nsys profile": "the nsys capture of a profile point: needs nsys and CUDA (docs/profile.md's "
                    "GPU step); `profile --nsys`, which prints it, runs here",
}
"""Doc lines not run here, by a fragment of their text, and why."""

SYNOPSES = {
    "lmscope bench ... --format md | csv | latex | json":
        ["bench --format md", "bench --format csv", "bench --format latex", "bench --format json"],
    "lmscope study [--budget 20m] [--out runs/study-<time>/] [--resume] [--device auto|cpu|cuda] "
    "[--plan-only]":
        ["study --budget 20m --out runs/study-<time>/ --device cpu --plan-only"],
}
"""Usage lines (`...`, `[optional]`, `a | b` alternatives) and the commands that stand for them:
each alternative once, optional parts given, the CPU of the devices (the others are refused or
planned by the lines that name them)."""

STAND_INS = {
    "my_package.models:make_model": ("own_models:regression", "a factory in a module on the Python "
                                     "path (tests/support/own_models.py)"),
}
"""Names in the docs that are the user's own, what stands for them, and why."""

REFUSED_ON_CPU = {
    "--attention naive,sdpa,flash": FLASH_ON_CPU,
    "--attention flash --fast off,on": FLASH_ON_CPU,
    "--device cuda": "--device cuda was asked for but no CUDA GPU is visible: use --device cpu",
}
"""Literal commands that need a GPU and say so in one line without one (fragment -> message)."""

READS_EARLIER_OUTPUT = ("table", "report")
"""Commands that read files an earlier run wrote (`runs/<time>/...`): left to their own tests,
tests/cli (table) and tests/report (report)."""


def expanded(commands: list[DocCommand]) -> list[DocCommand]:
    """The commands with each synopsis replaced by the commands that stand for it."""
    out = []
    for c in commands:
        out += [DocCommand(c.where, f"lmscope {s}") for s in SYNOPSES.get(c.text, [])] or [c]
    return out


def not_run(command: DocCommand) -> str | None:
    return next((why for fragment, why in NOT_RUN.items() if fragment in command.text), None)


COMMANDS = expanded(doc_commands())
LITERAL = [c for c in COMMANDS if not not_run(c) and c.command not in READS_EARLIER_OUTPUT]


def test_the_docs_have_the_commands_this_file_knows():
    """The collector finds the docs' commands, and every table entry still matches a doc line."""
    texts = [c.text for c in doc_commands()]
    assert len(texts) > 60 and "lmscope bench" in texts
    for fragment in [*NOT_RUN, *SYNOPSES, *REFUSED_ON_CPU]:
        assert any(fragment in t for t in texts), f"no doc line has {fragment!r} any more"
    for placeholder in STAND_INS:
        assert any(placeholder in c.text for c in COMMANDS), f"no doc line has {placeholder!r}"


def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
        raise SystemExit(0)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.fixture
def in_docs_folder(tmp_path, monkeypatch):
    """A folder like the repository's root (examples/ there), so relative paths in the docs
    resolve and what a command writes (runs/...) lands in tmp_path."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("doc", LITERAL, ids=[f"{c.where}:{c.command}" for c in LITERAL])
def test_doc_command_as_written_plans(doc, in_docs_folder, monkeypatch, capsys):
    """The command exactly as written passes the CLI's checks and plans its points (or, needing a
    GPU this machine lacks, is refused in the one line REFUSED_ON_CPU expects)."""
    monkeypatch.setenv("LMSCOPE_PLAN_ONLY", "1")
    argv = doc.argv + (["--plan-only"] if doc.command == "study" and "--plan-only" not in doc.argv else [])
    code, out, err = run_cli(capsys, argv)
    refusal = next((m for f, m in REFUSED_ON_CPU.items() if f in doc.text), None)
    if refusal and not torch.cuda.is_available():
        assert (code, err.strip()) == (2, f"lmscope: error: {refusal}")
        return
    assert code == 0, err
    if doc.command in ("bench", "profile", "memory", "attention", "comm", "ddp"):
        planned = re.search(r"LMSCOPE_PLAN_ONLY: (\d+) \w+ point\(s\) planned, none run", out)
        assert planned and len(out.strip().splitlines()) == 1 + int(planned.group(1)), out
    assert not list(Path("runs").glob("*/results.jsonl")), "a plan-only command wrote results"
