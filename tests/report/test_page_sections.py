"""A study's report sections show their answer: the accounting's predictions (and for which
device), the variable of every question even with one row, CPU time on a CPU, plots whose lines
and sizes can be told apart, each command once, and points measured in two sections."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.colors import to_rgba

from lmscope.report.page.build import run_sections
from lmscope.report.page.command import build_page
from lmscope.report.page.load import load_run
from lmscope.report.page.model import ImageBlock, TableBlock, TextBlock
from lmscope.report.page.plots import step_time_figure
from lmscope.study.sections import KERNELS_CPU_Q, build_sections
from lmscope.study.target import Target

H100_STUDY = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "study-h100"


def _study(tmp_path: Path, files: dict[str, list[str]], variables: bool = True) -> Path:
    """A study folder: each section's rows, and a manifest of the H100 study's sections (with the
    variables today's study records for them, or as an older manifest without them)."""
    manifest = json.loads((H100_STUDY / "study.json").read_text())
    sections = {s.name: s for s in build_sections(Target(**manifest["target"]), tmp_path)}
    kept = {}
    for name, lines in files.items():
        (tmp_path / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))
        state = dict(manifest["sections"][name])
        if variables:
            state["variables"] = sections[name].variables
        kept[name] = state
    manifest["sections"] = kept
    (tmp_path / "study.json").write_text(json.dumps(manifest))
    return tmp_path


def _lines(name: str) -> list[str]:
    return (H100_STUDY / f"{name}.jsonl").read_text().splitlines()


def _tables(section) -> list[TableBlock]:
    return [b for b in section.blocks if isinstance(b, TableBlock)]


def _texts(section) -> str:
    return " ".join(b.text for b in section.blocks if isinstance(b, TextBlock))


def test_the_accounting_shows_its_answer_and_says_it_is_a_prediction_for_its_device(tmp_path):
    (section,) = run_sections(load_run(_study(tmp_path, {"accounting": _lines("accounting")})))
    memory, moved, times = _tables(section)
    for table in (memory, moved, times):  # each says which mesh its row is
        assert table.header[:4] == ["model", "dp", "fsdp", "tp"] and len(table.rows) == 6
    assert {"total_gib", "device_memory_gib", "fits"} <= set(memory.header)
    assert {"dp_step_mb", "fsdp_step_mb"} <= set(moved.header)
    assert {"forward_bound", "backward_comm_ms", "backward_bound"} <= set(times.header)
    assert "Predictions for H100 SXM, not measurements" in _texts(section)


def test_a_section_with_one_row_still_shows_the_variable_of_its_question(tmp_path):
    for variables in (True, False):  # recorded in the manifest, or an older manifest's target
        folder = tmp_path / str(variables)
        folder.mkdir()
        compile_rows = [line for line in _lines("compile") if '"compile": true' in line][:1]
        warmup_rows = _lines("warmup")[:1]
        run = load_run(_study(folder, {"compile": compile_rows, "warmup": warmup_rows}, variables))
        compiled, warmup = run_sections(run)
        assert "compile" in _tables(compiled)[0].header, variables
        assert "warmup" in _tables(warmup)[0].header, variables


def test_the_cpu_study_asks_where_cpu_time_goes_and_its_plot_says_cpu(tmp_path):
    kernels = next(s for s in build_sections(Target(), tmp_path) if s.name == "kernels")
    assert kernels.question == KERNELS_CPU_Q and "GPU" not in kernels.question
    row = {"workload": "profile", "size": "tiny", "context_length": 64, "mode": "forward",
           "precision": "fp32", "status": "ok", "device_type": "cpu", "kernel_ms_per_step": 10.0,
           "matmul_frac": 0.7, "elementwise_frac": 0.3}
    (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
    (section,) = run_sections(load_run(tmp_path / "results.jsonl"))
    titles = [b.title for b in section.blocks if isinstance(b, ImageBlock)]
    assert titles == ["CPU op categories per phase"] and "GPU" not in section.question


def test_twelve_lines_take_twelve_colours_and_two_sizes_both_get_a_label():
    rows = [{"status": "ok", "parameters": params, "median_ms": 1.0 + i + params / 1e6, "mode": mode,
             "precision": "bf16", "context_length": ctx}
            for i, (mode, ctx) in enumerate((m, c) for m in ("forward", "forward-backward", "train-step")
                                            for c in (128, 256, 512, 1024))
            for params in (1_386_816, 3_412_352)]
    figure = step_time_figure(rows)
    ax = figure.axes[0]
    colours = [to_rgba(line.get_color()) for line in ax.get_lines()]
    assert len(colours) == 12 and len(set(colours)) == 12
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labels == ["1.39", "3.41"]


def test_each_command_is_said_once_at_the_top_not_in_every_section(tmp_path):
    folder = _study(tmp_path, {"compile": _lines("compile"), "warmup": _lines("warmup")})
    _, sections, intro = build_page([folder])
    command = "lmscope study --budget 8m50s --resume --out runs/study-h100c"
    assert intro.count(f"command: {command} (run 3 times)") == 1
    assert not any("command:" in line for s in sections for line in s.provenance)


def test_a_point_measured_in_two_sections_shows_both_measurements(tmp_path):
    """The committed H100 study measured medium bf16 train-step at 512 in precision and compile:
    the compile section shows both medians and their ratio."""
    folder = _study(tmp_path, {"precision": _lines("precision"), "compile": _lines("compile")})
    precision, compiled = run_sections(load_run(folder))
    twins = next(t for t in _tables(compiled) if t.title.startswith("the same point"))
    rows = [dict(zip(twins.header, row, strict=True)) for row in twins.rows]
    (medium,) = [r for r in rows if "size=medium" in r["point"]]
    assert medium["also measured in"] == "precision"
    assert abs(medium["ratio here/there"] - medium["median ms here"] / medium["median ms there"]) < 0.01
    assert medium["median ms here"] != medium["median ms there"]
    assert any(t.title.startswith("the same point") for t in _tables(precision))


def test_a_reused_row_is_said_to_be_reused(tmp_path):
    compile_rows = [json.loads(line) for line in _lines("compile")]
    source = next(r for r in compile_rows if r["size"] == "small" and not r["compile"])
    reused = [json.dumps({**source, "reused_from": "precision"})]
    folder = _study(tmp_path, {"compile": reused + [json.dumps(r) for r in compile_rows if r is not source]})
    (compiled,) = run_sections(load_run(folder))
    assert "Measured once, reused here: 1 of this section's 6 row(s)" in _texts(compiled)
    assert "1 in precision" in _texts(compiled)
