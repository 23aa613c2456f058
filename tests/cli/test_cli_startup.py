"""A typo costs well under a second: the command line checks its flags before it imports torch."""

import subprocess
import sys
import time

import pytest

from lmscope.inputs.choices import ATTENTION_BACKENDS
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
    ],
)
def test_a_bad_flag_is_refused_before_torch_is_imported(args, message):
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=120)
    elapsed = time.perf_counter() - started
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert message in lines[0] and lines[-1] == "imported: none", done.stderr
    # importing torch alone takes seconds; the bound is loose for a loaded CI machine
    assert elapsed < 30, elapsed


def test_the_attention_choices_are_the_registered_backends():
    assert set(ATTENTION_BACKENDS) == set(attention_backends())
