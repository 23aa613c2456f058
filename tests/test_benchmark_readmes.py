"""Every command in a ```bash block of benchmarks/results/**/README.md runs here, on the CPU.

A GPU script (`bash benchmarks/...sh`) runs with python3, nvidia-smi and torchrun stubbed by a
program that logs its arguments; each `python3 -m lmscope ...` it would run must parse. A script
of the repository (`python3 benchmarks/...py`) runs for real on copies of the rows it reads (with
a stand-in browser where it takes a screenshot), unless a test of its own runs it at CPU sizes.
An lmscope command must parse (the measured ones take minutes to hours).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from lmscope.cli import app

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STUBBED = ("python3", "nvidia-smi", "torchrun")

COVERED_BY = {
    "benchmarks/own_model/fidelity.py": "tests/test_own_model_fidelity_script.py",
    "benchmarks/attention/sm90_builds.py": "tests/kernels/test_flash_sm90.py",
    "benchmarks/own_model/train_curves.py": "tests/test_own_model_train_curves_script.py",
}
"""Scripts whose README command a test of their own runs at CPU sizes (the same code path: here
it would only repeat that test's seconds)."""


def readme_commands() -> list[tuple[str, str]]:
    """(README, command) for every line of every ```bash block of the results READMEs."""
    found = []
    for readme in sorted(RESULTS.glob("**/README.md")):
        inside = False
        for line in readme.read_text().split("\n"):
            if line.startswith("```"):
                inside = line.strip() == "```bash"
                continue
            if inside and line.strip() and not line.lstrip().startswith("#"):
                found.append((readme.relative_to(ROOT).as_posix(), line.strip()))
    return found


COMMANDS = readme_commands()


def split(line: str, out: Path) -> tuple[dict[str, str], list[str]]:
    """The command's leading VAR=value assignments and its words, `$OUT` being `out`."""
    words = shlex.split(line.split("  #")[0].replace("$OUT", str(out)))
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def parses(args: list[str]) -> None:
    """`lmscope ARGS` parses: every command and option known, every value of its type (nothing
    runs). Duck-typed: Typer's command classes are click's, or since 0.2x a copy of them."""
    command = typer.main.get_command(app)
    context = command.make_context("lmscope", list(args))
    while hasattr(command, "resolve_command"):  # a group: on to its subcommand
        protected = getattr(context, "_protected_args", None)
        if protected is None:
            protected = context.protected_args
        name, command, rest = command.resolve_command(context, [*protected, *context.args])
        context = command.make_context(name, rest, parent=context)


def copied(words: list[str], tmp_path: Path) -> list[str]:
    """`words` with every path under benchmarks/results replaced by a copy under `tmp_path`."""
    out = []
    for word in words:
        if word.startswith("benchmarks/results/"):
            source, copy = ROOT / word, tmp_path / "copy" / word
            copy.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, copy, dirs_exist_ok=True)
            elif source.exists():
                shutil.copy2(source, copy)
            word = str(copy)
        out.append(word)
    return out


def stub_bin(tmp_path: Path, calls: Path) -> Path:
    """A folder of stand-ins: the GPU tools log their arguments and leave an empty file (and its
    Markdown twin) where they are told to write one (`-o` / `--out`); chromium 'renders' a PNG."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in STUBBED:
        (folder / name).write_text(
            f"#!/usr/bin/env bash\n{{ printf {name}; printf ' %q' \"$@\"; echo; }} >> {calls}\nprev=\n"
            'for a in "$@"; do\n'
            '  if [[ $prev == -o || $prev == --out ]] && [[ $(basename "$a") == *.* ]]; then\n'
            '    mkdir -p "$(dirname "$a")" && touch "$a" "${a%.*}.md"\n'
            '  fi\n  prev=$a\ndone\n')
    page = RESULTS / "study-cpu" / "report.png"
    (folder / "chromium").write_text(
        "#!/usr/bin/env bash\nfor a in \"$@\"; do case $a in --screenshot=*) "
        f'cp {page} "${{a#--screenshot=}}";; esac; done\n')
    for program in folder.iterdir():
        program.chmod(0o755)
    return folder


def checkout(tmp_path: Path) -> Path:
    """A stand-in repository root whose code is this one's (links), so that what a script writes
    beside its OUT (its run folders under runs/) lands under `tmp_path`."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("benchmarks", "src", "tests", "examples", "pyproject.toml"):
        (root / name).symlink_to(ROOT / name)
    return root


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize(("readme", "line"), COMMANDS, ids=[f"{r}: {c[:60]}" for r, c in COMMANDS])
def test_readme_command_runs_on_the_cpu(readme: str, line: str, tmp_path: Path) -> None:
    out, calls = tmp_path / "out", tmp_path / "calls.txt"
    out.mkdir()
    calls.touch()
    assignments, words = split(line, out)
    env = {**os.environ, "OUT": str(out), "PYTHONPATH": str(ROOT / "src"), "MPLBACKEND": "Agg",
           **assignments}
    if words[0] == "bash":
        env["PATH"] = f"{stub_bin(tmp_path, calls)}:{os.environ['PATH']}"
        done = subprocess.run(words, cwd=checkout(tmp_path), env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        ran = calls.read_text().splitlines()
        assert any(call.startswith("python3 ") for call in ran), f"{words[1]} ran no python3: {ran}"
        for call in ran:
            call_words = shlex.split(call)
            if call_words[1:3] == ["-m", "lmscope"]:
                parses(call_words[3:])
        return
    assert words[0] == "python3", f"{readme}: a command this test does not know how to run: {line}"
    if words[1:3] == ["-m", "lmscope"]:
        parses(words[3:])
        return
    script = words[1]
    assert script.startswith("benchmarks/") and (ROOT / script).is_file(), f"{readme}: no script {script}"
    env["PATH"] = f"{stub_bin(tmp_path, calls)}:{os.environ['PATH']}"
    if script in COVERED_BY:
        assert script in (ROOT / COVERED_BY[script]).read_text()
        return
    args = [sys.executable, script, *copied(words[2:], tmp_path)]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_every_results_area_has_a_readme_with_a_command() -> None:
    areas = [folder for folder in RESULTS.iterdir() if folder.is_dir()]
    with_commands = {Path(readme).parent.name for readme, _ in COMMANDS}
    assert sorted(f.name for f in areas if not (f / "README.md").is_file()) == []
    assert sorted(f.name for f in areas if f.name not in with_commands) == []
