"""A typo costs well under a second: the command line checks its flags before it imports torch."""

import os
import subprocess
import sys
import time

import pytest

from lmscope.inputs.choices import ATTENTION_BACKENDS, FLASH_ON_CPU
from lmscope.model.attention import attention_backends

# A fresh interpreter runs the command line and reports whether torch (or transformers, triton)
# was imported by the time it refused the flags: wall time alone says little on a loaded machine.
PROBE = """
import sys
from lmscope.cli import main
try:
    main(sys.argv[1:])
finally:
    heavy = sorted(m for m in ("torch", "transformers", "triton") if m in sys.modules)
    print("imported:", ",".join(heavy) or "none", file=sys.stderr)
"""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "--precision", "fp33"], "unknown precision 'fp33'"),
        (["bench", "--model", "smal"], "unknown model size 'smal'"),
        (["bench", "--mode", "backwards", "--device", "cpu"], "unknown mode 'backwards'"),
        (["bench", "--context-length", "12x"], "--context-length takes integers"),
        (["bench", "--batch-size", "0"], "batch_size must be a positive integer"),
        (["bench", "--device", "cdua"], "unknown device 'cdua'"),
        (["profile", "--attention", "flsh"], "unknown attention backend 'flsh'"),
        (["memory", "--precision", "fp64"], "unknown precision 'fp64'"),
        (["ddp", "--model", "huge"], "unknown model size 'huge'"),
        (["bench", "--peer", "hff"], "unknown peer 'hff'"),
        (["bench", "--cuda-graph", "maybe"], "unknown --cuda-graph 'maybe'"),
        (["profile", "--fast", "maybe"], "--fast takes on/off"),  # no --model: checked before the default
        (["bench", "--bogus"], "No such option: --bogus"),
        (["attention", "--impl", "nope"], "unknown attention impl 'nope'"),
        (["attention", "--impl", "naive,all,flsh"], "unknown attention impl 'flsh'"),
        (["attention", "--dtype", "fp33"], "unknown dtype 'fp33'"),
        (["attention", "--passes", "fwd,bwdd"], "passes must be a comma list of fwd, bwd, fwd_bwd"),
        (["attention", "--preset", "leaderbord"], "unknown preset 'leaderbord'"),
        (["attention", "--device", "cdua"], "unknown device 'cdua'"),
        (["ddp", "--strategy", "naive,nope"], "unknown strategy 'nope'"),
        (["ddp", "--strategy", "bucketed:x"], "strategy 'bucketed:x' needs a positive bucket size"),
        (["ddp", "--attention", "flsh"], "unknown attention backend 'flsh'"),
        (["ddp", "--checkpoint", "evry:2"], "unknown checkpoint policy 'evry:2'"),
        (["comm", "--op", "all-reduce,nope"], "unknown collective 'nope'"),
        (["comm", "--dtype", "float33"], "unknown dtype 'float33'"),
        (["comm", "--size", "1XB"], "cannot read size '1XB'"),
        (["bench", "--checkpoint", "nope"], "unknown checkpoint policy 'nope'"),
        (["bench", "--checkpoint", "blocks:0-x"], "bad checkpoint policy blocks:0-x"),
        (["memory", "--checkpoint", "none;nope"], "unknown checkpoint policy 'nope'"),
        (["bench", "--attention", "naive,flash", "--device", "cpu"], FLASH_ON_CPU),
        (["profile", "--attention", "flash", "--device", "cpu"], FLASH_ON_CPU),
        (["memory", "--attention", "flash", "--device", "cpu"], FLASH_ON_CPU),
        (["ddp", "--attention", "flash", "--device", "cpu"], FLASH_ON_CPU),
    ],
)
def test_a_bad_flag_is_refused_before_torch_is_imported(args, message):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # flash runs there
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=120, env=env)
    elapsed = time.perf_counter() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert message in lines[0] and lines[-1] == "imported: none", done.stderr
    # importing torch alone takes seconds; the bound is loose for a loaded CI machine
    assert elapsed < 30, elapsed


def test_the_attention_choices_are_the_registered_backends():
    assert set(ATTENTION_BACKENDS) == set(attention_backends())
