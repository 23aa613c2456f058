"""The test children's budget: a slow child finishes, a runaway or a hung one is stopped."""

import os
import sys
import time

import pytest
from cpu_budget import ChildStopped, cpu_seconds, run_with_cpu_budget

pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"), reason="needs /proc")

# Burns `work` CPU seconds in slices, sleeping three times as long after each: a child that a
# loaded machine starves, slow in wall time but cheap in CPU time.
STARVED = """
import sys, time
work = float(sys.argv[1])
start = time.process_time()
while time.process_time() - start < work:
    burst = time.process_time()
    while time.process_time() - burst < 0.02:
        pass
    time.sleep(0.06)
print("done", file=sys.stderr)
print("worked")
sys.exit(3)
"""


def test_a_slow_child_within_its_cpu_budget_finishes_with_its_output():
    started = time.monotonic()
    done = run_with_cpu_budget([sys.executable, "-c", STARVED, "0.5"], cpu_budget_s=2.0, stall_s=10)
    wall = time.monotonic() - started
    assert wall > 2.0  # a wall-clock timeout as large as the budget would have killed it
    assert (done.returncode, done.stdout, done.stderr) == (3, "worked\n", "done\n")


def test_a_runaway_child_is_stopped_at_its_cpu_budget():
    started = time.monotonic()
    with pytest.raises(ChildStopped, match="past its budget of 1"):
        run_with_cpu_budget([sys.executable, "-c", "print('spinning', flush=True)\nwhile True: pass"],
                            cpu_budget_s=1.0, stall_s=60)
    assert time.monotonic() - started < 60


def test_a_hung_child_is_stopped_after_its_stall_time():
    started = time.monotonic()
    with pytest.raises(ChildStopped, match="used no CPU for .* it hangs"):
        run_with_cpu_budget([sys.executable, "-c", "import time; time.sleep(120)"], cpu_budget_s=60,
                            stall_s=2.0)
    assert time.monotonic() - started < 60


def test_cpu_seconds_reads_a_live_process_and_none_for_a_gone_one():
    before = cpu_seconds(os.getpid())
    start = time.process_time()
    while time.process_time() - start < 0.3:
        pass
    after = cpu_seconds(os.getpid())
    assert before is not None and after is not None and after - before >= 0.2
    assert cpu_seconds(2**22 + 12345) is None
