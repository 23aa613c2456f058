"""The comm workload on 2 gloo ranks: nccl-tests buffer layout, #wrong, algbw and busbw; the CLI."""

from __future__ import annotations

import json
import random

import pytest
import torch

from lmscope.accounting.comms import COLLECTIVES, bus_factor
from lmscope.cli import main
from lmscope.parallel.launch import RankContext, launch
from lmscope.workloads import collectives
from lmscope.workloads.collective_choices import parse_size_mb
from lmscope.workloads.collectives import Spec, collective

PRELOAD = ["torch._dynamo"]  # the forkserver of this test process may serve optimizer tests too


def test_parse_size_mb():
    assert parse_size_mb("1MB") == 1.0
    assert parse_size_mb("1GB") == 1000.0
    assert parse_size_mb(" 10 ") == 10.0
    assert parse_size_mb("256MiB") == pytest.approx(2**28 / 1e6)
    assert parse_size_mb("4kb") == 0.004
    for bad in ("", "MB", "1XB", "-3MB", "0"):
        with pytest.raises(ValueError, match="cannot read size"):
            parse_size_mb(bad)


def test_spec_validation():
    with pytest.raises(ValueError, match="unknown collective"):
        Spec(op="all-to-all", backend="gloo")
    with pytest.raises(ValueError, match="unknown dtype"):
        Spec(dtype="int8", backend="gloo")
    with pytest.raises(ValueError, match="fewer than one"):
        Spec(size_mb=4e-6, world_size=2, backend="gloo")
    with pytest.raises(ValueError, match="iters"):
        Spec(iters=0, backend="gloo")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--backend gloo"):
            Spec(backend="nccl")


def test_element_counts_follow_nccl_tests():
    # all-gather / reduce-scatter: S is the total buffer, each rank holds S / n
    def counts(op: str) -> tuple[int, int]:
        return Spec(op=op, size_mb=0.0121, world_size=4, backend="gloo").element_counts()

    assert counts("all-gather") == counts("reduce-scatter") == (756, 3024)
    assert counts("all-reduce") == counts("broadcast") == (3025, 3025)


def _corrupted_wrong_count(ctx: RankContext, broken: int) -> int:
    op = collective(Spec(op="all-reduce", size_mb=0.00404, world_size=1, backend="gloo"), ctx)
    op.prepare()
    op.call()
    op.result[torch.randperm(op.result.numel())[:broken]] += 1
    return int((op.result != op.expected()).sum())


def test_wrong_count_sees_corrupted_results():
    broken = random.randint(1, 50)
    assert launch(_corrupted_wrong_count, broken, nproc=1, backend="gloo") == broken


@pytest.mark.parametrize("op", COLLECTIVES)
def test_rows_are_correct_on_two_gloo_ranks(op):
    size_mb = random.choice([0.0101, 0.0263, 0.0077])
    dtype = random.choice(["float32", "bfloat16", "float64"])
    point = dict(op=op, size_mb=size_mb, world_size=2, backend="gloo", dtype=dtype, warmup=1, iters=3)
    row = collectives.run_point(point)
    itemsize = torch.empty(0, dtype=collectives.DTYPES[dtype]).element_size()
    per_rank, total = Spec(**point).element_counts()
    count = total if op in ("all-gather", "reduce-scatter") else per_rank
    assert row["wrong"] == 0
    assert row["count"] == count and row["bytes"] == count * itemsize
    assert row["algbw_gbps"] == pytest.approx(row["bytes"] / (row["time_ms"] / 1e3) / 1e9)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * bus_factor(op, 2))
    assert row["time_rank_min_ms"] <= row["time_ms"] <= row["time_rank_max_ms"]
    assert row["backend_used"] == "gloo"


def test_comm_command_writes_rows_table_and_plot(tmp_path):
    out = tmp_path / "results.jsonl"
    main(["comm", "--op", "all-reduce", "--size", "6kB", "--nproc", "2", "--backend", "gloo",
          "--warmup", "1", "--iters", "2", "--out", str(out), "--format", "md", "--timeout", "120"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["status"] == "ok", rows
    assert rows[0]["wrong"] == 0 and rows[0]["bytes"] == 6000
    assert rows[0]["busbw_gbps"] == pytest.approx(rows[0]["algbw_gbps"])  # 2(n-1)/n = 1 for n = 2
    assert out.with_suffix(".busbw.png").stat().st_size > 1000
    assert "busbw_gbps" in out.with_suffix(".md").read_text()


def test_comm_command_rejects_bad_flags(capsys):
    with pytest.raises(SystemExit) as done:
        main(["comm", "--size", "huge"])
    assert done.value.code == 2
    assert "cannot read size" in capsys.readouterr().err
