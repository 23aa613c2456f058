"""`lmscope.provenance`, where the README points: the provenance every row carries, and `stamp(row)`
for one's own scripts.

The code lives in `lmscope.records.provenance`; this module re-exports its public names.
"""

from lmscope.records.provenance import (
    code_identity,
    cpu_model,
    git_state,
    gpu_state,
    host_identity,
    is_lmscope_checkout,
    kernel_env,
    process_state,
    provenance,
    source_hash,
    source_identity,
    source_label,
    stamp,
)

__all__ = [
    "code_identity",
    "cpu_model",
    "git_state",
    "gpu_state",
    "host_identity",
    "is_lmscope_checkout",
    "kernel_env",
    "process_state",
    "provenance",
    "source_hash",
    "source_identity",
    "source_label",
    "stamp",
]
