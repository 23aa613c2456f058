"""`lmscope report`: a page from each kind of results file, a study folder, and two runs compared."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from page_checks import check_page

from lmscope.records.stats import ratio_interval
from lmscope.report.page.command import build_page, write_report
from lmscope.report.page.compare import compare_section
from lmscope.report.page.load import Run
from lmscope.report.page.model import ImageBlock, TableBlock

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
KINDS = {
    "bench": ("bench/bench.jsonl", 10, "step time vs size"),
    "profile": ("profile/results.jsonl", 4, "kernel categories per phase"),
    "memory": ("memory/results.jsonl", 6, "memory peak per context"),
    "attention": ("attention/32-round-h100/tflops.jsonl", 8, "attention latency vs sequence length"),
    "comm": ("distributed/comm.jsonl", 8, "busbw vs size"),
    "ddp": ("distributed/ddp-x2-paired/ddp.jsonl", 6, None),
}


def _subset(tmp_path: Path, source: str, rows: int, name: str = "results.jsonl") -> Path:
    """The first `rows` rows of a committed results file (bench: every 12th, so sizes vary)."""
    lines = (RESULTS / source).read_text().splitlines()[:: 12 if source.startswith("bench/") else 1][:rows]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("kind", list(KINDS))
def test_report_of_each_kind_of_results_file(tmp_path, kind):
    source, rows, image = KINDS[kind]
    path = _subset(tmp_path, source, rows)
    html_path, md_path = write_report([path], tmp_path / "report.html")
    page = check_page(html_path.read_text())
    assert sum(page.tables) >= min(rows, 2)
    title, sections, _ = build_page([path])
    (section,) = sections
    assert section.title == kind and section.question.endswith("?")
    assert any(line.startswith("device_name: NVIDIA") for line in section.provenance)
    assert any(line.startswith("git_sha: ") for line in section.provenance)
    images = [b.title for b in section.blocks if isinstance(b, ImageBlock)]
    if image:
        assert image in images and len(page.images) >= 1
    markdown = md_path.read_text()
    assert f"## {kind}" in markdown
    for link in [line.split("](")[1].rstrip(")") for line in markdown.splitlines() if line.startswith("![")]:
        assert (md_path.parent / link).read_bytes()[:4] == b"\x89PNG"


LONG_NAME = (
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8>"
    "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8::Params)"
)


def _kernel(name: str, total_ns: float, category: str) -> dict:
    return {
        "name": name,
        "time_pct": 50.0,
        "total_ns": total_ns,
        "instances": 6,
        "avg_ns": total_ns / 6,
        "med_ns": total_ns / 6,
        "category": category,
    }


def test_profile_artifacts_give_kernel_tables_per_phase_with_full_names_on_hover(tmp_path):
    point = tmp_path / "profile" / "large-ctx128-point"
    point.mkdir(parents=True)
    phases = {
        phase: {
            "kernels": [_kernel(LONG_NAME, 3e6, "matmul"), _kernel("softmax_kernel", 1e6, "reduction")],
            "category_ms_per_step": {"matmul": 1.0, "reduction": 0.5},
        }
        for phase in ("forward", "backward", "step")
    }
    (point / "profile.json").write_text(json.dumps({"steps": 3, "phases": phases}))
    record = {
        "workload": "profile",
        "size": "large",
        "context_length": 128,
        "mode": "train-step",
        "precision": "bf16",
        "status": "ok",
        "device_name": "GPU",
        "profile_json_path": "/elsewhere/out/profile/large-ctx128-point/profile.json",
    }
    (tmp_path / "results.jsonl").write_text(json.dumps(record) + "\n")
    html_path, _ = write_report([tmp_path], None)
    page = check_page(html_path.read_text())
    assert page.titles.count(LONG_NAME) == 3
    _, sections, _ = build_page([tmp_path])
    titles = [b.title for b in sections[0].blocks]
    assert "kernel categories per phase" in titles
    assert [t for t in titles if t.startswith("kernels: ")] == [
        f"kernels: large 128 train-step bf16, {p} (top 15)" for p in ("forward", "backward", "step")
    ]
    cell = next(b for b in sections[0].blocks if isinstance(b, TableBlock) and b.title.startswith("kernels"))
    shown = cell.rows[0][-1]
    assert shown.full == LONG_NAME and len(shown.text) < len(LONG_NAME)


def test_memory_predicted_beside_measured(tmp_path):
    path = _subset(tmp_path, "memory/results.jsonl", 4)
    _, sections, _ = build_page([path])
    table = next(b for b in sections[0].blocks if isinstance(b, TableBlock))
    assert "step_peak_gib" in table.header and "predicted_step_peak_gib" in table.header


def test_study_folder_sections_follow_the_manifest(tmp_path):
    _subset(tmp_path, "bench/bench.jsonl", 6, "timing.jsonl")
    manifest = {
        "commands": ["lmscope study --budget 9m"],
        "sections": {
            "timing": {
                "question": "How long does a step take?",
                "workload": "bench",
                "file": "timing.jsonl",
                "points": 6,
                "skip_reason": None,
            },
            "comm": {
                "question": "How fast are collectives?",
                "workload": "comm",
                "file": "comm.jsonl",
                "points": 0,
                "skip_reason": "needs 2+ GPUs (1 here)",
            },
        },
    }
    (tmp_path / "study.json").write_text(json.dumps(manifest))
    html_path, _ = write_report([tmp_path], None)
    assert html_path == tmp_path / "report.html"
    text = html_path.read_text()
    check_page(text)
    assert "How long does a step take?" in text and "Not measured: needs 2+ GPUs (1 here)." in text
    assert text.count("command: lmscope study --budget 9m") == 1  # once, not per section


def _run(label: str, times: dict[int, list[float]]) -> Run:
    records = [
        {
            "workload": "bench",
            "size": "tiny",
            "context_length": ctx,
            "mode": "train-step",
            "status": "ok",
            "device_name": label,
            "times_ms": t,
            "median_ms": statistics.median(t),
        }
        for ctx, t in times.items()
    ]
    return Run(label=label, base=Path("."), records=records)


def test_comparison_ratio_and_noise_on_synthetic_times():
    jitter = [-0.02, 0.01, 0.0, 0.03, -0.01, 0.02, -0.03]
    a = _run("A", {128: [10.0 + j for j in jitter], 256: [8.0 + j for j in jitter]})
    b = _run("B", {128: [5.0 + j for j in jitter], 256: [8.0 + j for j in reversed(jitter)]})
    section = compare_section(a, b)
    table = next(block for block in section.blocks if isinstance(block, TableBlock))
    rows = {row[1]: dict(zip(table.header, row, strict=True)) for row in table.rows}
    faster = rows["size=tiny context_length=128 mode=train-step"]
    assert faster["ratio A/B"] == pytest.approx(2.0)
    expected = ratio_interval(a.records[0]["times_ms"], b.records[0]["times_ms"])
    assert faster["low (95%)"] == pytest.approx(expected.low, abs=1e-3) and faster["low (95%)"] > 1.9
    assert faster["verdict"] == "B faster"
    same = rows["size=tiny context_length=256 mode=train-step"]
    assert same["ratio A/B"] == pytest.approx(1.0)
    assert same["low (95%)"] <= 1.0 <= same["high (95%)"] and same["verdict"] == "inside the noise"
    assert "1 inside the noise" in section.blocks[0].text


def test_two_runs_give_the_comparison_first(tmp_path):
    a = _subset(tmp_path, "bench/bench.jsonl", 4, "a.jsonl")
    b = _subset(tmp_path, "bench/bench.jsonl", 4, "b.jsonl")
    title, sections, _ = build_page([a, b])
    assert sections[0].title == "compare: a vs b"
    table = next(block for block in sections[0].blocks if isinstance(block, TableBlock))
    assert len(table.rows) == 4 and all(row[-1] == "inside the noise" for row in table.rows)


def test_report_rejects_what_it_cannot_read(tmp_path):
    with pytest.raises(FileNotFoundError):
        build_page([tmp_path / "missing.jsonl"])
    with pytest.raises(ValueError, match="no results"):
        build_page([tmp_path])
    path = _subset(tmp_path, "bench/bench.jsonl", 2)
    with pytest.raises(ValueError, match=".html"):
        write_report([path], tmp_path / "report.pdf")


def test_peers_in_one_run_pair_points_that_differ_only_in_the_peer_field():
    from lmscope.report.page.peers import peer_table, varying_peer_fields

    jitter = [0.0, 0.1, -0.1, 0.05, -0.05]
    records = [
        {
            "workload": "bench",
            "size": "tiny",
            "context_length": ctx,
            "precision": p,
            "status": "ok",
            "times_ms": [base + j for j in jitter],
        }
        for ctx, fp32, bf16 in ((128, 9.0, 3.0), (256, 6.0, 6.0))
        for p, base in (("bf16", bf16), ("fp32", fp32))
    ]
    assert varying_peer_fields(records) == ["precision"]
    table = peer_table(records, "precision")
    rows = {row[0]: dict(zip(table.header, row, strict=True)) for row in table.rows}
    assert rows["context_length=128"]["precision (base)"] == "fp32"
    assert rows["context_length=128"]["ratio base/other"] == pytest.approx(3.0)
    assert rows["context_length=128"]["verdict"] == "bf16 faster"
    assert rows["context_length=256"]["ratio base/other"] == pytest.approx(1.0)
    assert rows["context_length=256"]["verdict"] == "inside the noise"


def test_memory_timelines_are_found_under_a_copied_run_folder(tmp_path):
    point = tmp_path / "memory" / "2.7B-ctx512-point"
    point.mkdir(parents=True)
    png = (RESULTS / "memory" / "timeline_2.7B_forward.png").read_bytes()
    (point / "timeline.png").write_bytes(png)
    record = json.loads((RESULTS / "memory" / "results.jsonl").read_text().splitlines()[1])
    record["timeline_png"] = "/gone/runs/memory-gpu/memory/2.7B-ctx512-point/timeline.png"
    (tmp_path / "results.jsonl").write_text(json.dumps(record) + "\n")
    _, sections, _ = build_page([tmp_path])
    timelines = [
        b for b in sections[0].blocks if isinstance(b, ImageBlock) and b.title.startswith("memory timeline")
    ]
    assert len(timelines) == 1 and timelines[0].png == png


def test_a_study_sections_rows_read_in_sweep_order_not_in_the_order_a_resumed_run_wrote_them():
    from lmscope.report.page.build import sweep_order

    ran = [
        {"size": "large", "context_length": 128, "mode": "forward"},
        {"size": "small", "context_length": 512, "mode": "train-step"},
        {"size": "small", "context_length": 128, "mode": "train-step", "status": "error"},
        {"size": "hf:gpt2", "context_length": 128, "mode": "forward"},
        {"size": "small", "context_length": 128, "mode": "forward"},
        {"size": "small", "context_length": 128, "mode": "train-step", "status": "ok"},
        {"size": "medium", "context_length": 512, "mode": "forward", "status": "oom"},
    ]
    ordered = [(r["size"], r["context_length"], r["mode"], r.get("status")) for r in sweep_order(ran)]
    assert ordered == [
        ("small", 128, "forward", None),
        ("small", 128, "train-step", "error"),  # the resume's ok row stays after it: the report shows it
        ("small", 128, "train-step", "ok"),
        ("small", 512, "train-step", None),
        ("medium", 512, "forward", "oom"),  # presets by their parameter count, failed rows too
        ("large", 128, "forward", None),
        ("hf:gpt2", 128, "forward", None),  # a source that is not a preset after them
    ]
