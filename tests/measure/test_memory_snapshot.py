"""Snapshots: reconstructing active memory from a trace, top allocations, the timeline PNG."""

from __future__ import annotations

import inspect
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from lmscope.measure.memory import (
    MemoryMeter,
    PhasePeaks,
    build_timeline,
    load_snapshot,
    site,
    top_allocations,
)
from lmscope.report.memory_plots import PALETTE, band_groups, plot_timeline

FIXTURES = Path(__file__).parents[1] / "fixtures" / "memory"
MIB = 2**20


@pytest.fixture
def hand_snapshot(tmp_path: Path) -> Path:
    """The hand-built snapshot (JSON in the repo), pickled the way torch writes one."""
    snapshot = json.loads((FIXTURES / "hand_snapshot.json").read_text())
    path = tmp_path / "hand.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    return path


def test_timeline_rebuilds_active_memory_and_phases(hand_snapshot):
    timeline = build_timeline(load_snapshot(hand_snapshot), phases=["forward", "backward", "optimizer"])
    assert timeline.events == 7  # alloc/free_completed only, phase markers left out
    assert timeline.boundaries == ((0, "forward"), (3, "backward"), (6, "optimizer"))
    assert (timeline.active() / MIB).tolist() == [3.5, 7.5, 7.0, 5.0, 7.0, 9.0, 7.0]
    before = sorted((b.size, b.end) for b in timeline.blocks if b.start < 0)
    assert before == [(MIB // 2, 2), (MIB, 7)]  # freed during the trace; alive in a segment all along
    phases = [timeline.phase_at(i) for i in (0, 2, 3, 5, 6)]
    assert phases == ["forward", "forward", "backward", "backward", "optimizer"]


def test_blocks_from_before_the_trace_count_their_requested_bytes(hand_snapshot):
    """The trace records what each tensor asked for; a block alive from before it counts the same
    way (its `requested_size`), not the allocator's rounded block."""
    snapshot = load_snapshot(hand_snapshot)
    block = snapshot["segments"][0]["blocks"][0]
    block["size"], block["requested_size"] = MIB + 512, MIB - 3
    before = build_timeline(load_snapshot(hand_snapshot)).active()
    assert (before - build_timeline(snapshot).active()).tolist() == [3] * 7


def test_unnamed_phases_are_numbered(hand_snapshot):
    timeline = build_timeline(load_snapshot(hand_snapshot))
    assert [name for _, name in timeline.boundaries] == ["phase 1", "phase 2", "phase 3"]


def test_top_allocations_name_the_first_frame_outside_torch(hand_snapshot):
    timeline = build_timeline(load_snapshot(hand_snapshot), phases=["forward", "backward", "optimizer"])
    top = top_allocations(timeline, 3)
    assert [(g.size // MIB, g.count, g.site, g.phase) for g in top] == [
        (4, 1, "train.py:12 main", "forward"),
        (2, 1, "model/attention.py:51 naive_attention", "forward"),
        (2, 1, "no Python frame (autograd engine or C++)", "backward"),
    ]
    assert len(top_allocations(timeline, 10)) == 4
    assert top[0].as_record() == {"size_mib": 4.0, "count": 1, "site": "train.py:12 main", "phase": "forward"}


def test_site_skips_torch_and_the_standard_library():
    frames = [("/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1, "_call_impl"),
              ("/usr/lib/python3.11/contextlib.py", 2, "__enter__"),
              ("/src/lmscope/model/transformer.py", 41, "forward")]
    assert site(frames) == "model/transformer.py:41 forward"
    assert site(frames[:2]) == "torch internals"
    assert site([]) == "no Python frame (autograd engine or C++)"


def test_not_a_snapshot_is_refused(tmp_path):
    path = tmp_path / "x.pickle"
    path.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ValueError, match="not a memory snapshot"):
        load_snapshot(path)


def test_timeline_png_draws_the_largest_allocations_as_bands(hand_snapshot, tmp_path):
    timeline = build_timeline(load_snapshot(hand_snapshot), phases=["forward", "backward", "optimizer"])
    groups = band_groups(timeline, 2)
    assert [g.size // MIB for g in groups] == [4, 2]
    path = plot_timeline(timeline, tmp_path / "t.png", title="hand", groups=2)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(path)[..., :3]
    for color in PALETTE[:2]:  # each band's colour is on the image
        rgb = np.array([int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
        assert (np.abs(pixels - rgb).max(axis=-1) < 0.02).any(), color


def test_cpu_meter_records_a_snapshot_that_parses(tmp_path):
    meter = MemoryMeter(torch.device("cpu"))
    with meter:
        weights = torch.ones(1000)  # allocated before recording: the floor of the timeline
        clock = PhasePeaks(meter, markers=True)
        with meter.record(max_entries=10_000):
            clock.start()
            a = weights * 2  # 4000 bytes
            clock.mark("one")
            b = torch.empty(3, 7, dtype=torch.float64)  # 168 bytes
            del a
            clock.mark("two")
            path = meter.dump(tmp_path / "cpu.pickle")
        del b
    assert clock.peaks["one"][0] == 8000 and clock.peaks["one"][1] is None  # no reserved memory on CPU
    assert clock.peaks["two"][0] == 8000 + 168  # b allocated before a is freed
    timeline = build_timeline(load_snapshot(path), phases=["one", "two"])
    assert [name for _, name in timeline.boundaries] == ["one", "two", "after"]
    assert timeline.active().max() == 8168
    assert timeline.active()[-1] == 4000 + 168
    sites = {site(b.frames) for b in timeline.blocks if b.start >= 0}
    assert any("test_cpu_meter_records_a_snapshot_that_parses" in s for s in sites)


def test_live_tensor_bytes_count_storages_once_and_frees():
    meter = MemoryMeter(torch.device("cpu"))
    with meter:
        x = torch.zeros(5, 11)  # 220 bytes
        view = x.t()[1:]
        x.add_(1)  # in place: same storage
        assert meter.current() == 220
        y = x.double()  # 440 bytes
        assert meter.current() == 660 and meter.peak() == 660
        del y
        assert meter.current() == 220 and meter.peak() == 660
        meter.reset_peak()
        assert meter.peak() == 220
        del view


def test_the_installed_torch_takes_the_history_keywords_lmscope_passes():
    # MemoryMeter.record calls _record_memory_history(enabled=, context=, stacks=, max_entries=)
    memory = torch.cuda.memory
    impl = getattr(memory, "_record_memory_history_impl", memory._record_memory_history)
    assert {"enabled", "context", "stacks", "max_entries"} <= set(inspect.signature(impl).parameters)
    assert "filename" in inspect.signature(memory._dump_snapshot).parameters


@pytest.mark.skipif(not (FIXTURES / "tiny_snapshot.pickle").exists(),
                    reason="the tiny model's GPU snapshot is committed after the GPU run")
def test_real_gpu_snapshot_of_the_tiny_model(tmp_path):
    timeline = build_timeline(load_snapshot(FIXTURES / "tiny_snapshot.pickle"),
                              phases=["forward", "backward", "optimizer"])
    assert [name for _, name in timeline.boundaries][:3] == ["forward", "backward", "optimizer"]
    active = timeline.active()
    assert active.max() > active[0] > 0
    top = top_allocations(timeline, 5)
    assert any(g.site.startswith(("model/", "workloads/")) for g in top)
    assert plot_timeline(timeline, tmp_path / "tiny.png", title="tiny").stat().st_size > 10_000
