"""benchmarks/distributed/fsdp_host_time.py on one gloo rank: it times the FSDP step against the
unwrapped one and every hook per call, with the call counts a step of its model makes."""

from __future__ import annotations

import random

from scripts import load_script

from lmscope.parallel.launch import launch


def test_the_script_times_every_hook_with_a_step_s_call_counts():
    script = load_script("benchmarks/distributed/fsdp_host_time.py", "fsdp_host_time")
    layers = random.randint(2, 5)
    args = {"num_layers": layers, "d_model": 8, "vocab_size": 32, "seq": 5, "batch_size": 1,
            "warmup": 1, "steps": 2, "cprofile": 0}
    result = launch(script.measure, args, nproc=1, backend="gloo", timeout_s=120)
    assert result["units"] == layers + 3  # the embedding, each block, the LM head, the root
    assert result["plain_ms"] > 0 and result["fsdp_ms"] > 0
    hooks = result["hooks"]
    gathered = layers + 2  # every unit but the root, once a step
    assert hooks["FullyShardedDP._pre_forward"][0] == gathered
    assert hooks["FullyShardedDP._pre_backward"][0] == gathered
    assert hooks["FullyShardedDP._reduce_scatter"][0] == gathered + 1  # the root's too
    assert all(us > 0 for _, us in hooks.values())
