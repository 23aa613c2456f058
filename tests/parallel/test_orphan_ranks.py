"""A multi-rank run killed with SIGKILL leaves no process behind, and no temporary folder for good."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from lmscope.parallel.tempdirs import remove_stale
from lmscope.running.point_worker import PointWorker

MARK = "LMSCOPE_TEST_RUN_MARK"


def _marked(mark: str) -> list[int]:
    """Pids of the processes whose environment carries this run's mark."""
    needle = f"{MARK}={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_sigkill_of_the_launcher_ends_every_rank(tmp_path):
    """main -> point worker -> forkserver + resource tracker -> 2 gloo ranks; kill -9 main."""
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    command = [sys.executable, "-m", "lmscope", "comm", "--nproc", "2", "--backend", "gloo",
               "--size", "1MB", "--warmup", "1", "--iters", "1000000", "--timeout", "300",
               "--out", str(tmp_path / "r.jsonl")]
    log = (tmp_path / "log").open("w")
    main = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while len(_marked(mark)) < 6 and time.monotonic() < deadline:  # main, worker, 2 + 2 ranks
            assert main.poll() is None, f"the run ended early: {(tmp_path / 'log').read_text()}"
            time.sleep(0.2)
        assert len(_marked(mark)) >= 6, f"ranks not up: {_marked(mark)}"
        worker = next(pid for pid in _marked(mark) if _parent(pid) == main.pid)
        time.sleep(1.0)  # the ranks are inside their collectives
        main.send_signal(signal.SIGKILL)
        main.wait()
        deadline = time.monotonic() + 10
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _marked(mark)
        assert not left, f"processes of the run still alive 10 s after kill -9: {left}"
        for prefix in ("lmscope-worker-", "lmscope-ranks-"):  # what the next start does
            remove_stale(prefix)
        assert not list(Path(tempfile.gettempdir()).glob(f"lmscope-worker-{main.pid}-*"))
        assert not list(Path(tempfile.gettempdir()).glob(f"lmscope-ranks-{worker}-*"))
    finally:
        log.close()
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def test_stale_temporary_folders_are_removed_at_the_next_start(tmp_path):
    root = Path(tempfile.gettempdir())
    stale = root / f"lmscope-worker-{_dead_pid()}-abc"
    live = root / f"lmscope-worker-{os.getpid()}-keepme"
    stale.mkdir()
    live.mkdir()
    (stale / "log").write_text("left by kill -9")
    try:
        worker = PointWorker("bench")
        worker.close(kill=True)
        assert not stale.exists() and live.exists()
    finally:
        for folder in (stale, live):
            if folder.exists():
                (folder / "log").unlink(missing_ok=True)
                folder.rmdir()


def test_remove_stale_keeps_foreign_names(tmp_path):
    (tmp_path / "lmscope-ranks-notapid").mkdir()
    (tmp_path / f"lmscope-ranks-{_dead_pid()}-x").mkdir()
    removed = remove_stale("lmscope-ranks-", root=str(tmp_path))
    assert len(removed) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lmscope-ranks-notapid"]
