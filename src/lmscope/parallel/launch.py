"""Run a function on N ranks: local processes (one GPU each, or gloo on CPU) or under torchrun.

`launch(fn, *args, nproc=N)` calls `fn(ctx, *args)` on every rank inside an initialized process
group and returns what rank 0 returned. Local ranks are forked from a forkserver that has
imported torch once (CUDA is initialized only in the ranks); each takes this process's
environment and imports `fn`'s module from the file this process has it from (not what the
forkserver holds from whichever launch started it). They meet at a store that this process
serves on 127.0.0.1 and are watched by this process: when one raises, dies or is still running
at the deadline, the others are killed and `RankFailure` names the rank and why. Collectives
carry the same timeout (`init_process_group(timeout=...)`), and ranks die with their launcher.
Every rank (local or under torchrun) waits at the store for all to return from `fn` before
tearing its group down.

Under torchrun (RANK, WORLD_SIZE and LOCAL_RANK set) this process is one rank: it joins the
job's group through the torchrun store under a key of its own (`run_id`, so consecutive points
of a sweep do not read each other's keys) and returns this rank's value. `fn` should aggregate
across ranks itself (`across_ranks`) so that every rank returns the same answer.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import functools
import hashlib
import importlib
import importlib.util
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import select
import signal
import statistics
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from lmscope.parallel.tempdirs import owned_tempdir, pid_running

NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""Set (unless already set) in every rank: NVLink multicast stays off on the shared machines."""

FORKSERVER_PRELOAD_ENV = "LMSCOPE_FORKSERVER_PRELOAD"
"""Modules (comma separated) for the forkserver to import whichever launch starts it, e.g. in a
test process whose launches need different ones: 'torch._dynamo,pytest'. A speed-up only."""

BACKENDS = ("auto", "gloo", "nccl")
MAX_LOCAL_RANKS = 1024
"""Most ranks one launcher starts on its machine (each is a process that imports torch)."""
FAILURE_GRACE_S = 2.0
"""After a first rank fails, how long the others get to fail on their own (their reasons help)."""


class RankFailure(RuntimeError):
    """A rank raised, died or hung; the message names it (and what it said)."""


@dataclass(frozen=True)
class RankContext:
    """Where `fn` runs: its rank, the world, the backend and the device of this rank."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


def torchrun_env() -> dict[str, int] | None:
    """RANK, WORLD_SIZE, LOCAL_RANK when this process was started by torchrun, else None."""
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    if not all(name in os.environ for name in names):
        return None
    return {name.lower(): int(os.environ[name]) for name in names}


def default_world_sizes() -> list[int]:
    """[WORLD_SIZE] under torchrun, else [2]: the --nproc default."""
    env = torchrun_env()
    return [env["world_size"]] if env else [2]


def resolve_backend(backend: str) -> str:
    """'auto' -> nccl when CUDA is available, else gloo."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def check_world(world_size: int, backend: str) -> None:
    """Reject a world this machine (or this torchrun job) cannot run, with the fix."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world size must be a positive integer, got {world_size!r}: pass --nproc N")
    backend = resolve_backend(backend)
    if torchrun_env() is None and world_size > MAX_LOCAL_RANKS:
        raise ValueError(f"{world_size} local ranks are {world_size} processes on this machine: at most "
                         f"{MAX_LOCAL_RANKS}; run under torchrun across nodes for more")
    env = torchrun_env()
    if env is not None:
        if world_size not in (1, env["world_size"]):
            raise ValueError(
                f"under torchrun the world size is WORLD_SIZE={env['world_size']}, not {world_size}: "
                f"pass --nproc {env['world_size']} (or 1 for a single-GPU point)"
            )
        return
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend nccl needs CUDA GPUs and none is visible: use --backend gloo")
        if world_size > torch.cuda.device_count():
            raise ValueError(
                f"{world_size} ranks need {world_size} GPUs, {torch.cuda.device_count()} visible: "
                "lower --nproc or run under torchrun across nodes"
            )


def point_id(workload: str, point: dict[str, Any]) -> str:
    """A short key of a measured point, the same on all its ranks (a `run_id` for `launch`)."""
    return hashlib.sha1(json.dumps([workload, point], sort_keys=True).encode()).hexdigest()[:16]


def launch(
    fn: Callable[..., Any],
    *args: Any,
    nproc: int,
    backend: str = "auto",
    timeout_s: float = 600.0,
    run_id: str = "run",
    preload: Sequence[str] = (),
) -> Any:
    """Run `fn(ctx, *args)` on `nproc` ranks and return rank 0's value (this rank's under torchrun).

    `fn` must be a module-level function (or a partial of one) and its value picklable; local
    ranks import its module from the file this process has it from, so a module imported by
    path (pytest's importlib mode, a script) works too. With nproc=1 it runs here in this
    process, in a world of one. Raises `RankFailure` naming the failed rank.
    `preload`: library modules the forkserver imports once for all local ranks (with torch)
    when this launch is the one that starts it (it then serves every later launch of this
    process), e.g. torch._dynamo, which every optimizer imports. Only a speed-up: a rank imports
    whatever its forkserver lacks.
    """
    backend = resolve_backend(backend)
    check_world(nproc, backend)
    env = torchrun_env()
    if env is not None and nproc > 1:
        return _run_torchrun_rank(fn, args, env, backend, timeout_s, run_id)
    if nproc == 1:
        local_rank = env["local_rank"] if env else 0
        return _run_in_process(fn, args, local_rank, backend, timeout_s)
    return _run_local(fn, args, nproc, backend, timeout_s, preload)


def across_ranks(metrics: dict[str, float | None]) -> dict[str, float | None]:
    """Mean over ranks of each metric, with its min and max over ranks (`x_ms` -> `x_rank_min_ms`).

    A collective: every rank calls it with the same keys and gets the same answer.
    """
    gathered: list[dict[str, float | None]] = [{} for _ in range(dist.get_world_size())]
    dist.all_gather_object(gathered, metrics)
    out: dict[str, float | None] = {}
    for key in metrics:
        values = [g[key] for g in gathered if g.get(key) is not None]
        out[key] = statistics.fmean(values) if values else None
        out[_tagged(key, "rank_min")] = min(values) if values else None
        out[_tagged(key, "rank_max")] = max(values) if values else None
    return out


UNIT_SUFFIXES = ("_ms", "_us", "_s", "_gib", "_mib", "_gbps", "_pct")


def _tagged(key: str, tag: str) -> str:
    """'step_ms' + 'rank_min' -> 'step_rank_min_ms' (the unit stays last)."""
    for suffix in UNIT_SUFFIXES:
        if key.endswith(suffix):
            return f"{key[: -len(suffix)]}_{tag}{suffix}"
    return f"{key}_{tag}"


def _rank_env() -> None:
    for name, value in NO_MULTICAST_ENV.items():
        os.environ.setdefault(name, value)


def _device(backend: str, local_rank: int) -> torch.device:
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _init(
    backend: str, rank: int, world_size: int, local_rank: int, timeout_s: float, store: dist.Store
) -> RankContext:
    device = _device(backend, local_rank)
    options: dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size,
        timeout=dt.timedelta(seconds=timeout_s), **options,
    )
    return RankContext(rank, world_size, local_rank, backend, device)


def _run_in_process(
    fn: Callable[..., Any], args: tuple[Any, ...], local_rank: int, backend: str, timeout_s: float
) -> Any:
    """A world of one in this process (the single-GPU baseline), on this rank's local device."""
    _rank_env()
    ctx = _init(backend, 0, 1, local_rank, timeout_s, dist.HashStore())
    try:
        return fn(ctx, *args)
    finally:
        dist.destroy_process_group()


def _run_torchrun_rank(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    env: dict[str, int],
    backend: str,
    timeout_s: float,
    run_id: str,
) -> Any:
    """Join the torchrun job's group as this rank, through its store under the key `run_id`."""
    _rank_env()
    rank, world_size = env["rank"], env["world_size"]
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
        is_master=rank == 0 and not agent, timeout=dt.timedelta(seconds=timeout_s),
        multi_tenant=True,
    )
    store = dist.PrefixStore(f"lmscope/{run_id}", base)
    ctx = _init(backend, rank, world_size, env["local_rank"], timeout_s, store)
    try:
        value = fn(ctx, *args)
        _leave_together(store, rank, world_size)
        return value
    finally:
        dist.destroy_process_group()


def _leave_together(store: dist.Store, rank: int, world_size: int) -> None:
    """Wait at the store until every rank has returned from `fn`, before any tears its group down.

    A rank that returns first (from a `fn` without collectives, say) and closes its connections
    can break a peer that is still connecting to it: gloo's "connectFullMesh failed ... Connection
    closed by peer", in 3 of 150 launches of a no-op on 4 CPU ranks of a loaded 2-core host (none
    of 650 with this wait).
    """
    store.set(f"lmscope/returned/{rank}", "1")
    store.wait([f"lmscope/returned/{peer}" for peer in range(world_size)])


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent (the forkserver) dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)


LAUNCHER_POLL_S = 0.5
"""Where the launcher cannot be watched through a pidfd: how often a rank checks it is alive."""


def _die_with_launcher(launcher_pid: int) -> None:
    """SIGKILL this rank as soon as the launcher process ends, however it ends (kill -9 too).

    A rank's parent is the forkserver, not the launcher, and the forkserver stays up while any
    rank it forked lives (each holds its liveness pipe): without this watch, a launcher killed
    with SIGKILL left the forkserver, the resource tracker and every rank running until the
    collectives' timeout. A daemon thread waits on a pidfd of the launcher (Linux >= 5.3), else
    polls for it; the forkserver and the resource tracker exit once their ranks are gone.
    """

    def kill_self() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    try:
        pidfd = os.pidfd_open(launcher_pid)
    except ProcessLookupError:
        kill_self()
        return
    except (AttributeError, OSError):
        pidfd = None

    def watch() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while pid_running(launcher_pid):
                time.sleep(LAUNCHER_POLL_S)
        kill_self()

    threading.Thread(target=watch, name="lmscope-launcher-watch", daemon=True).start()


def _local_rank_main(
    payload: bytes,
    origin: tuple[str, str | None] | None,
    environ: dict[str, str],
    rank: int,
    nproc: int,
    port: int,
    backend: str,
    timeout_s: float,
    workdir: str,
    launcher_pid: int,
) -> None:
    """Body of one local rank: import fn, init, run, write rank 0's value or this rank's error."""
    _die_with_parent()
    _die_with_launcher(launcher_pid)
    os.environ.clear()  # the launcher's environment now, not the forkserver's from its start
    os.environ.update(environ)
    _rank_env()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc))
    if backend == "gloo":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nproc))
    folder = Path(workdir)
    try:
        _import_origin(origin)
        fn, args = pickle.loads(payload)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=dt.timedelta(seconds=timeout_s))
        ctx = _init(backend, rank, nproc, rank, timeout_s, store)
        value = fn(ctx, *args)
        if rank == 0:
            partial = folder / "result.tmp"
            partial.write_bytes(pickle.dumps(value))
            partial.rename(folder / "result.pkl")
        (folder / f"rank{rank}.returned").touch()  # a timeout names the ranks still inside fn
        _leave_together(store, rank, nproc)
        dist.destroy_process_group()
    except BaseException as error:  # noqa: BLE001 - any failure is reported to the launcher
        reason = f"{type(error).__name__}: {error}".strip().replace("\n", " ")
        (folder / f"rank{rank}.err").write_text(f"{time.time()}\n{reason}\n{traceback.format_exc()}")
        os._exit(1)  # skip destroying a group that a failed peer may hang


def _origin(fn: Callable[..., Any]) -> tuple[str, str | None] | None:
    """fn's module and the file this process imported it from (None for __main__)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__module__", None)
    if not name or name in ("__main__", "__mp_main__"):
        return None  # multiprocessing itself runs the main script in every rank
    return name, getattr(sys.modules.get(name), "__file__", None)


def _import_origin(origin: tuple[str, str | None] | None) -> None:
    """Import fn's module in this rank, from the launcher's file, before unpickling fn and args.

    By name when that finds the launcher's file (sys.path is the launcher's here); else from
    the file under the launcher's name for it, with empty modules for parents that do not
    import (as pytest makes them). pytest's importlib mode, for one, names a test
    module `tests.parallel.test_x` without `tests` being importable: the ranks found it only
    when the forkserver had happened to import some test module first (from its working
    directory), so the tests passed in one order and failed in another.
    """
    if origin is None:
        return
    name, file = origin
    module = sys.modules.get(name)
    if module is None:
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
    if file is None or (module is not None and _same_file(getattr(module, "__file__", None), file)):
        return
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        return  # unpickling fn then names the module it cannot find
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    while "." in name:  # pickle imports `a` and `a.b` before `a.b.c`: stand-ins where they fail
        name, _, child = name.rpartition(".")
        parent = sys.modules.get(name)
        if parent is None:
            try:
                parent = importlib.import_module(name)
            except ImportError:
                parent = sys.modules[name] = types.ModuleType(name, "stand-in: a parent of fn's module")
        setattr(parent, child, module)
        module = parent


def _same_file(a: str | None, b: str) -> bool:
    return a is not None and os.path.realpath(a) == os.path.realpath(b)


def _context(preload: Sequence[str]) -> Any:
    """The forkserver context. Its server, started once per process by the first local launch,
    imports torch, this module, the modules named in $LMSCOPE_FORKSERVER_PRELOAD (comma
    separated) and that launch's `preload`: library modules only (each rank imports fn's module).
    """
    context = mp.get_context("forkserver")
    named = [m.strip() for m in os.environ.get(FORKSERVER_PRELOAD_ENV, "").split(",") if m.strip()]
    modules = ["torch", "torch.distributed", __name__, *named, *preload]
    context.set_forkserver_preload(list(dict.fromkeys(modules)))
    return context


def _run_local(fn: Callable[..., Any], args: tuple[Any, ...], nproc: int, backend: str,
               timeout_s: float, preload: Sequence[str]) -> Any:
    context = _context(preload)
    payload, origin = pickle.dumps((fn, args)), _origin(fn)
    # The ranks' store is served from here, on the port the OS gives it as it binds: a port picked
    # free in advance could be taken by another process while the ranks start (seconds). `server`
    # must live until this function returns: dropping it closes the store.
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=dt.timedelta(seconds=timeout_s))
    port = server.port
    with owned_tempdir("lmscope-ranks-") as workdir:
        processes = [
            context.Process(
                target=_local_rank_main,
                args=(payload, origin, dict(os.environ), rank, nproc, port, backend, timeout_s, workdir,
                      os.getpid()),
                name=f"lmscope-rank{rank}",
            )
            for rank in range(nproc)
        ]
        started = []
        try:
            for process in processes:
                process.start()
                started.append(process)
            _watch(processes, timeout_s, Path(workdir))
        finally:
            for process in started:
                if process.exitcode is None:
                    process.kill()
                process.join()
        return pickle.loads((Path(workdir) / "result.pkl").read_bytes())


def _watch(processes: list[Any], timeout_s: float, workdir: Path) -> None:
    """Wait for all ranks; on the first failure or at the deadline, raise naming the rank(s)."""
    deadline = time.monotonic() + timeout_s
    exited_at: dict[int, float] = {}
    failed_at: float | None = None
    while True:
        for rank, process in enumerate(processes):
            if process.exitcode is not None and rank not in exited_at:
                exited_at[rank] = time.time()
        running = [p for p in processes if p.exitcode is None]
        failed = [rank for rank, p in enumerate(processes) if p.exitcode not in (None, 0)]
        if failed and failed_at is None:
            failed_at = time.monotonic()
        now = time.monotonic()
        if not running or now >= deadline or (failed_at and now - failed_at >= FAILURE_GRACE_S):
            break
        limit = deadline if failed_at is None else min(deadline, failed_at + FAILURE_GRACE_S)
        multiprocessing.connection.wait([p.sentinel for p in running], timeout=limit - now)
    if failed:
        raise RankFailure(_failure_message(processes, failed, exited_at, workdir))
    if running:
        ranks = [processes.index(p) for p in running]
        inside = [rank for rank in ranks if not (workdir / f"rank{rank}.returned").exists()] or ranks
        names = ", ".join(f"rank {rank}" for rank in inside)
        raise RankFailure(f"{names} did not finish within the timeout of {timeout_s:g} s (killed)")


def _failure_message(
    processes: list[Any], failed: list[int], exited_at: dict[int, float], workdir: Path
) -> str:
    """'rank R of N failed: <reason>' for the likely cause, then the others briefly.

    A rank that died without reporting an exception comes first (a peer's failure shows up in
    the others as exceptions from their collectives), then reports in the order they were written.
    """
    reasons = []
    for rank in failed:
        path = workdir / f"rank{rank}.err"
        if path.exists():
            stamp, reason = path.read_text().splitlines()[:2]
            reasons.append((1, float(stamp), rank, reason))
        else:
            code = processes[rank].exitcode
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            reasons.append((0, exited_at[rank], rank, f"died ({how})"))
    reasons.sort()
    _, _, rank, reason = reasons[0]
    message = f"rank {rank} of {len(processes)} failed: {reason}"
    others = [f"rank {r}: {why[:120]}" for _, _, r, why in reasons[1:]]
    return message + (f" (then {'; '.join(others)})" if others else "")
