"""The launcher: values and aggregation across ranks, and failing, dying or hanging ranks."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch.distributed as dist

from lmscope.parallel.launch import (
    NO_MULTICAST_ENV,
    RankContext,
    RankFailure,
    _leave_together,
    across_ranks,
    check_world,
    default_world_sizes,
    launch,
    point_id,
    torchrun_env,
)

PRELOAD = ["torch._dynamo"]  # the forkserver of this test process may serve optimizer tests too


def _report(ctx: RankContext, folder: str) -> dict[str, object]:
    Path(folder, f"pid{ctx.rank}").write_text(str(os.getpid()))
    stats = across_ranks({"value_ms": float(ctx.rank + 1), "missing_ms": None if ctx.rank else 3.0,
                          "count": 10.0 * ctx.rank})
    env = {name: os.environ.get(name) for name in [*NO_MULTICAST_ENV, "LMSCOPE_TEST_MARK"]}
    return {"ctx": ctx, "stats": stats, "env": env, "group_size": dist.get_world_size()}


def _raise_on_rank1(ctx: RankContext, folder: str) -> None:
    Path(folder, f"pid{ctx.rank}").write_text(str(os.getpid()))
    if ctx.rank == 1:
        raise ValueError("boom from the test")
    dist.barrier()  # rank 0 waits for a peer that is gone


def _die_on_rank1(ctx: RankContext, folder: str) -> None:
    Path(folder, f"pid{ctx.rank}").write_text(str(os.getpid()))
    if ctx.rank == 1:
        os._exit(7)
    dist.barrier()


def _hang_on_rank1(ctx: RankContext, folder: str) -> int:
    Path(folder, f"pid{ctx.rank}").write_text(str(os.getpid()))
    if ctx.rank == 1:
        time.sleep(600)
    return ctx.rank


def _gone(folder: Path) -> bool:
    pids = [int(path.read_text()) for path in folder.glob("pid*")]
    assert pids, "no rank started"
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def test_launch_returns_rank0_value_and_aggregates(tmp_path, monkeypatch):
    monkeypatch.setenv("LMSCOPE_TEST_MARK", "first")  # the ranks see the launcher's environment now
    launch(_report, str(tmp_path), nproc=2, backend="gloo", timeout_s=120, preload=PRELOAD)
    monkeypatch.setenv("LMSCOPE_TEST_MARK", "second")  # not the forkserver's from its start
    got = launch(_report, str(tmp_path), nproc=2, backend="gloo", timeout_s=120, preload=PRELOAD)
    assert got["ctx"].rank == 0 and got["ctx"].world_size == 2 and got["group_size"] == 2
    assert got["ctx"].device.type == "cpu"
    stats = got["stats"]
    assert stats["value_ms"] == 1.5 and stats["value_rank_min_ms"] == 1 and stats["value_rank_max_ms"] == 2
    assert stats["missing_ms"] == 3.0 and stats["missing_rank_min_ms"] == 3.0  # None is left out
    assert stats["count_rank_max"] == 10.0
    expected = {name: os.environ.get(name, value) for name, value in NO_MULTICAST_ENV.items()}
    assert got["env"] == {**expected, "LMSCOPE_TEST_MARK": "second"}
    assert _gone(tmp_path)


@pytest.mark.parametrize(("fn", "reason"), [(_raise_on_rank1, "ValueError: boom from the test"),
                                            (_die_on_rank1, "exited with code 7")])
def test_failed_rank_ends_the_run_fast_and_is_named(tmp_path, fn, reason):
    begin = time.monotonic()
    with pytest.raises(RankFailure) as failure:
        launch(fn, str(tmp_path), nproc=2, backend="gloo", timeout_s=300, preload=PRELOAD)
    assert time.monotonic() - begin < 60  # well under the timeout
    assert str(failure.value).startswith("rank 1 of 2 failed:"), str(failure.value)
    assert reason in str(failure.value)
    assert _gone(tmp_path)


def test_hung_rank_is_killed_at_the_timeout_and_named(tmp_path):
    begin = time.monotonic()
    with pytest.raises(RankFailure, match=r"^rank 1 did not finish within the timeout of 4 s"):
        launch(_hang_on_rank1, str(tmp_path), nproc=2, backend="gloo", timeout_s=4, preload=PRELOAD)
    assert time.monotonic() - begin < 60
    assert _gone(tmp_path)


BY_PATH = """
from dataclasses import dataclass


@dataclass
class Box:
    value: int


def unbox(ctx, box):
    return ctx.rank, __file__, box.value + 1
"""


def test_no_rank_leaves_before_every_rank_has_returned():
    store = dist.HashStore()
    rank0 = threading.Thread(target=_leave_together, args=(store, 0, 2), daemon=True)
    rank0.start()
    rank0.join(timeout=0.5)
    assert rank0.is_alive()  # rank 0 returned first: it waits for rank 1
    _leave_together(store, 1, 2)
    rank0.join(timeout=30)
    assert not rank0.is_alive()


def test_fn_from_a_module_imported_by_path(tmp_path, monkeypatch):
    # Under a name no rank can import (as pytest's importlib mode names test modules
    # `tests.parallel.test_x`): the ranks load it from its file, whatever the forkserver preloaded.
    path = tmp_path / "by_path.py"
    path.write_text(BY_PATH)
    name = "lmscope_not_a_package.by_path"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lmscope_not_a_package", types.ModuleType("lmscope_not_a_package"))
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    got = launch(module.unbox, module.Box(41), nproc=2, backend="gloo", timeout_s=120, preload=PRELOAD)
    assert got == (0, str(path), 42)


def test_torchrun_environment(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert torchrun_env() is None and default_world_sizes() == [2]
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert torchrun_env() == {"rank": 3, "world_size": 8, "local_rank": 1}
    assert default_world_sizes() == [8]
    check_world(8, "gloo")
    check_world(1, "gloo")
    with pytest.raises(ValueError, match="WORLD_SIZE=8"):
        check_world(4, "gloo")


def test_world_checks_and_point_ids():
    with pytest.raises(ValueError, match="--nproc"):
        check_world(0, "gloo")
    with pytest.raises(ValueError, match="unknown backend"):
        check_world(2, "mpi")
    assert point_id("comm", {"a": 1, "b": 2}) == point_id("comm", {"b": 2, "a": 1})
    assert point_id("comm", {"a": 1}) != point_id("ddp", {"a": 1})
