"""Session-wide settings, and fresh random inputs in every test."""

from __future__ import annotations

import os

import pytest
import torch
from leak_report_filter import filter_leak_report_at_exit

SEED_ENV = "LMSCOPE_TEST_SEED"


def pytest_configure(config):
    # One forkserver serves every local launch of the test process, whichever test starts it:
    # preload what the ranks of any of them import (optimizers torch._dynamo, test modules pytest),
    # so that no test's speed depends on the order the tests run in.
    os.environ.setdefault("LMSCOPE_FORKSERVER_PRELOAD", "torch._dynamo,pytest")
    # Below the summary, Triton's nanobind would list the MLIR objects its caches hold.
    filter_leak_report_at_exit()


@pytest.fixture(autouse=True)
def fresh_torch_seed():
    """Seed torch from the OS before each test: its generator otherwise starts from the same
    fixed seed in every process, so each run would draw the same "random" inputs. The seed is
    printed (pytest shows it with a failure); LMSCOPE_TEST_SEED=<seed> replays it."""
    seed = int(os.environ.get(SEED_ENV) or int.from_bytes(os.urandom(4), "little"))
    torch.manual_seed(seed)
    print(f"torch seed {seed} (replay with {SEED_ENV}={seed})")


@pytest.fixture(scope="module")
def launch_seed() -> int:
    """The seed a module's rank processes draw their inputs from (launched ranks do not inherit
    the test's torch seed): LMSCOPE_TEST_SEED replays it, else fresh from the OS; printed, and
    the parallel tests put it in their failure messages."""
    seed = int(os.environ.get(SEED_ENV) or int.from_bytes(os.urandom(4), "little")) % 10**6
    print(f"launch seed {seed} (replay with {SEED_ENV}={seed})")
    return seed
