"""benchmarks/distributed/profile_fsdp_step.py on the CPU: its breakdown of a hand-made trace, and
its row written by `append_record` (a failed run is a row too), without launching any rank."""

from __future__ import annotations

import json
import random
import sys

import pytest
from scripts import load_script

from lmscope.measure.kernels import STEP, Activity, Span, Trace
from lmscope.records.results import scan_results

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
COPY = "Memcpy DtoH (Device -> Pinned)"


@pytest.fixture(scope="module")
def script():
    return load_script("benchmarks/distributed/profile_fsdp_step.py", "profile_fsdp_step")


def test_a_step_splits_into_compute_exposed_communication_copies_and_idle(script):
    o = random.randrange(10**6, 10**9)
    acts = [Activity(GEMM, o, 30, o + 1, "stream 7"), Activity(GEMM, o + 20, 20, o + 2, "stream 9"),
            Activity(GATHER, o + 35, 20, o + 3, "stream 20"), Activity(COPY, o + 60, 17, o + 4, "stream 30")]
    trace = Trace(acts, [Span(STEP, o, o + 100), Span("forward", o, o + 10)], on_gpu=True)
    row = script.breakdown(trace)
    ms = 1e-6
    assert row["step_wall_ms"] == pytest.approx(100 * ms)
    assert row["compute_ms"] == pytest.approx(40 * ms)  # two GEMMs overlapping on two streams
    assert row["exposed_comm_ms"] == pytest.approx(15 * ms)  # the gather's [40, 55)
    assert row["exposed_copy_ms"] == pytest.approx(17 * ms)
    assert row["idle_ms"] == pytest.approx(28 * ms)  # [55, 60) and [77, 100)
    assert row["forward_gpu_ms"] == pytest.approx(50 * ms)  # both GEMMs were launched in it


@pytest.mark.parametrize(("failure", "status"), [("CUDA out of memory. Tried to allocate", "oom"),
                                                 ("rank 1 exited with code 1", "error")])
def test_a_failed_run_is_a_row_on_a_line_of_its_own(script, tmp_path, monkeypatch, failure, status):
    out = tmp_path / "rows" / "profile.jsonl"
    out.parent.mkdir()
    out.write_text('{"policy": "none", "status": "ok"}\n{"policy": "blo')  # a writer killed mid-row

    def failing_launch(*args, **kwargs):
        raise RuntimeError(f"{failure}\nsecond line")

    monkeypatch.setattr(script, "launch", failing_launch)
    monkeypatch.setattr(sys, "argv", ["profile_fsdp_step.py", "--out", str(out), "--checkpoint", "every:3"])
    script.main()
    results = scan_results(out)
    assert [r["status"] for r in results.records] == ["ok", status]
    row = results.records[-1]
    assert row["checkpoint"] == "every:3"
    assert row["error"] == failure and row["strategy"] == "fsdp" and "git_sha" in row
    assert [s.number for s in results.skipped] == [2]  # the torn line stays apart from the new row
    assert json.loads(out.read_text().splitlines()[-1]) == row
