"""Session-wide settings."""

from __future__ import annotations

import os


def pytest_configure(config):
    # One forkserver serves every local launch of the test process, whichever test starts it:
    # preload what the ranks of any of them import (optimizers torch._dynamo, test modules pytest),
    # so that no test's speed depends on the order the tests run in.
    os.environ.setdefault("LMSCOPE_FORKSERVER_PRELOAD", "torch._dynamo,pytest")
