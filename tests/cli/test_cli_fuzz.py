"""Fuzzing the command line: bad values for every flag of every command end in exit 2 and one line.

Every option of every command (found from the app itself, so a new flag is fuzzed too) gets
values no command can take: text that is no number or name, negative, zero where a count must be
positive, huge integers, inf and nan. Each call runs in this process (`lmscope.cli.main`) with
the sweep runner replaced by one that fails the test: a bad value must be refused before anything
runs.
"""

from __future__ import annotations

import contextlib
import io
import json
import types
import typing
from pathlib import Path

import pytest
import typer.main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmscope.cli import app, main, sweep

NOT_FUZZED = {"out", "resume", "reuse_worker", "nsys", "plot", "worked_example", "version"}
"""Paths (any name is a valid file) and on/off switches (no value to get wrong)."""
FREE_TEXT = {("plan flops", "device_name")}
"""Text options any value of which is valid (a device missing from the catalog gets no MFU)."""
NEGATIVE_OK = {("precision accumulate", "value")}
"""Options for which a negative number is a valid value."""
ZERO_OK = {"warmup", "check_max_seq", "warmup_ms", "value", "round_", "margin", "profile_steps"}
"""Options for which zero is a valid value (0 warm-up steps, never check, add 0.0, the first of
--rounds, no margin under the budget, no profiled steps)."""
INT_LISTS = {"context_length", "batch_size", "nproc", "warmup", "count", "batch", "heads", "head_dim",
             "seq_len", "contexts"}
"""Text options that hold a comma list of integers."""


def _commands() -> list[tuple[str, list[tuple[str, str, type]]]]:
    """(command path, [(option, parameter name, base type)]) of every command of the app."""
    found = []
    groups = [("", app)] + [(g.name, g.typer_instance) for g in app.registered_groups]
    for prefix, group in groups:
        click_group = typer.main.get_command(group)
        for info in group.registered_commands:
            name = info.name or info.callback.__name__
            hints = typing.get_type_hints(info.callback)
            options = []
            for param in click_group.commands[name].params:
                if (not param.opts[0].startswith("--") or param.name in NOT_FUZZED
                        or (f"{prefix} {name}".strip(), param.name) in FREE_TEXT):
                    continue
                base = hints[param.name]
                if isinstance(base, types.UnionType):
                    base = next(t for t in typing.get_args(base) if t is not type(None))
                options.append((param.opts[0], param.name, base))
            found.append(((f"{prefix} {name}").strip(), options))
    return found


COMMANDS = _commands()
OPTIONS = [(path, option, name, base) for path, options in COMMANDS for option, name, base in options]


def _bad_values(path: str, name: str, base: type) -> list[str]:
    """Values this option can never take."""
    huge = "99999999999999999999"
    if base is int:
        values = ["1.5x", huge, "-1"]
    elif base is float:
        values = ["inf", "nan"]
        if (path, name) not in NEGATIVE_OK:
            values.append("-1")
    else:
        values = ["", "x!,%"] if name not in INT_LISTS else ["", "-3", huge, "16,,32"]
    if name not in ZERO_OK and base is not str and (path, name) not in NEGATIVE_OK:
        values.append("0")
    return values


@pytest.fixture(scope="module")
def results_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "results.jsonl"
    path.write_text(json.dumps({"workload": "bench", "size": "tiny", "status": "ok", "mean_ms": 1.0}) + "\n")
    return path


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a bad value reached the runner")

    monkeypatch.setattr(sweep, "run_sweep", refuse)


def _call(argv: list[str]) -> tuple[int | str | None, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
            code: int | str | None = 0
        except SystemExit as exit_info:
            code = exit_info.code
    return code, err.getvalue()


def _argv(path: str, option: str, value: str, results: Path) -> list[str]:
    head = path.split()
    if head == ["table"]:
        head.append(str(results))
    return [*head, f"{option}={value}" if value.startswith("-") or not value else option, *(
        [] if value.startswith("-") or not value else [value])]


def _check(argv: list[str]) -> None:
    code, err = _call(argv)
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err, f"{argv}: exit {code}\n{err[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("lmscope: error: "), f"{argv}: {err}"


def test_every_command_has_fuzzed_options():
    assert {path for path, _ in COMMANDS} >= {"bench", "profile", "memory", "attention", "comm", "ddp",
                                              "table", "plan flops", "plan parallel", "precision accumulate"}
    assert len(OPTIONS) > 150


@pytest.mark.parametrize(("path", "option", "name", "base"), OPTIONS,
                         ids=[f"{p}:{o}" for p, o, _, _ in OPTIONS])
def test_each_bad_value_is_one_line_and_exit_2(path, option, name, base, results_file):
    for value in _bad_values(path, name, base):
        _check(_argv(path, option, value, results_file))


TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               min_size=1, max_size=12)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_bad_values(data, results_file):
    path, option, name, base = data.draw(st.sampled_from(OPTIONS))
    if base is int:
        value = str(data.draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63),
                                        TEXT.filter(lambda t: not t.strip().lstrip("+-").isdigit()))))
    elif base is float:
        value = data.draw(st.one_of(st.sampled_from(["inf", "nan", "-inf", "1e999"]),
                                    TEXT.filter(lambda t: not _is_number(t))))
    elif name in INT_LISTS:
        value = str(data.draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=2**63))))
    else:
        value = "!" + data.draw(TEXT)
    _check(_argv(path, option, value, results_file))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
