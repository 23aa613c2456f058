"""benchmarks/attention/sm90_builds.py: an sm_90 build of a FlashAttention kernel without a GPU."""

import pytest
from scripts import load_script

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def builds():
    return load_script("benchmarks/attention/sm90_builds.py", "sm90_builds")


def test_a_small_forward_config_builds_with_pipelined_loads(builds) -> None:
    """The smallest config of the forward at head dim 32: ptxas reports registers and spills, and
    the loads are async copies (the divisibility hints reached the compiler)."""
    autotuned, names, table = builds.KERNELS["fwd"]
    smallest = min(table["small"], key=lambda t: t[0] * t[1])
    config = builds.fa_tuning._cfg(names, smallest)
    constexprs = {"HEAD_DIM": 32, "D_MAIN": 32, "D_TAIL": 0, "CAUSAL": True, "DOT_PREC": "tf32",
                  **config.kwargs}  # fmt: skip
    found = builds.build(autotuned.fn, constexprs, config.num_warps, config.num_stages)
    assert 0 < found["registers"] <= 255
    assert found["spill_stores"] is not None and found["shared_bytes"] > 0
    assert found["async_copies"]
