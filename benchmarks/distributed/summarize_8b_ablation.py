"""The 8B ablation's table from the rows `run_8b_ablation.sh` writes, one row per change.

    python3 benchmarks/distributed/summarize_8b_ablation.py OUT

Reads OUT/plans.json (row -> policy), OUT/ablation-<row>.jsonl (the `lmscope ddp` rows),
OUT/llama-peer-<stage>.jsonl (the peer of each call: a, b, c) and OUT/profile-best.jsonl, and writes
OUT/ablation.md: per row the policy, the median step (rank 0's), the peak memory per rank (the
largest over ranks) beside the fast model's prediction (`lmscope.accounting.fast_memory`), the
model-FLOPs MFU (causal attention at half the square, against the device's dense bf16 peak) and
the peer's median step from the same call with its ratio to ours; then the profile of the best
step. The policy cell names the FSDP variant, the attention and where AdamW's moments live where
they are not the defaults (fsdp, flash, device). Rows that did not run say so.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from lmscope.accounting.devices import peak_tflops
from lmscope.accounting.fast_memory import predict_fast_memory
from lmscope.accounting.treatment_cost import model_step_flops
from lmscope.config import preset
from lmscope.parallel.strategies import BASELINE, parse_strategy

ROWS = {"full": "a", "planned": "a", "selective": "a", "offload": "b", "best": "b"}
"""Each row and the call (stage) it runs in by default, with that call's peer; a row run again
(stage c) names its stage in plans.json, and its latest run counts."""
GIB = 2**30


HEADER = ("row", "policy", "step ms", "peak GiB per rank (measured / predicted)", "MFU %",
          "peer ms (same call)", "peer / ours")
PROFILE = ("step", "compute", "exposed comm", "exposed copies", "idle", "recompute", "rebuild", "optimizer")


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _last_ok(path: Path) -> dict[str, Any] | None:
    return next((r for r in reversed(_rows(path)) if r.get("status") == "ok"), None)


def _peer_of(path: Path, row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The peer of `row`'s call, if it ran ok: the last peer that ran before the row (each call runs
    its peer first, and a stage run in several calls appends them all to one file), never an
    earlier call's; without a row, the last ok peer."""
    if row is None or not row.get("time"):
        return _last_ok(path)
    when = datetime.fromisoformat(row["time"])
    before = [r for r in _rows(path) if r.get("time") and datetime.fromisoformat(r["time"]) <= when]
    return before[-1] if before and before[-1].get("status") == "ok" else None


def _fsdp_row(out: Path, label: str) -> dict[str, Any] | None:
    """The row's latest lmscope FSDP run, in any of its variants (`FSDP_STRATEGY`)."""
    rows = [r for r in _rows(out / f"ablation-{label}.jsonl")
            if r.get("strategy", BASELINE) != BASELINE and parse_strategy(r["strategy"])[0] == "fsdp"]
    return rows[-1] if rows else None


def _config(row: dict[str, Any]):
    shape = {k: row[k] for k in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")}
    return preset(row["size"], **shape, context_length=row["context_length"])


def _mfu(row: dict[str, Any]) -> float | None:
    peak = peak_tflops(row.get("device_name"), "bf16")
    if peak is None or not row.get("step_median_ms"):
        return None
    flops = model_step_flops(_config(row), row["batch_size"], row["context_length"], causal=True)
    return 100 * flops / (row["step_median_ms"] / 1e3) / (peak * 1e12)


def _predicted_peak(row: dict[str, Any]) -> float:
    return predict_fast_memory(_config(row), batch_size=row["batch_size"], seq_len=row["context_length"],
                               precision=row["precision"], attention=row["attention"],
                               checkpoint=row["checkpoint"], world_size=row["world_size"],
                               optimizer_state=row.get("optimizer_state", "device")).step_peak / GIB


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}" if isinstance(value, float) else str(value)


def _line(cells: list[str] | tuple[str, ...]) -> str:
    return "| " + " | ".join(cells) + " |"


_NAMES = {"host": "moments on the host"}


def _policy(row: dict[str, Any], policy: str) -> str:
    """The policy, with the FSDP variant, the attention and where the moments live where they are
    not the defaults."""
    defaults = {"strategy": "fsdp", "attention": "flash", "optimizer_state": "device"}
    values = {key: row.get(key, default) for key, default in defaults.items()}
    variant = [_NAMES.get(value, value) for key, value in values.items() if value != defaults[key]]
    return f"{policy} ({', '.join(variant)})" if variant else policy


def _ablation_line(label: str, row: dict[str, Any] | None, policy: str, peer_ms: float | None) -> str:
    if row is None or row.get("status") != "ok":
        status = "not run" if row is None else f"{row.get('status')}: {str(row.get('error', ''))[:80]}"
        return _line([label, policy, status, "", "", _fmt(peer_ms, 0), ""])
    ours = row["step_median_ms"]
    peak = f"{_fmt(row.get('peak_after_optimizer_rank_max_gib'))} / {_fmt(_predicted_peak(row))}"
    ratio = f"{peer_ms / ours:.2f}x" if peer_ms else "-"
    policy = _policy(row, row["checkpoint"])
    return _line([label, policy, _fmt(ours, 0), peak, _fmt(_mfu(row)), _fmt(peer_ms, 0), ratio])


def _profile_lines(profile: dict[str, Any]) -> list[str]:
    keys = ("step_wall_ms", "compute_ms", "exposed_comm_ms", "exposed_copy_ms", "idle_ms")
    times = [_fmt(profile.get(k)) for k in keys]
    shares = [f"{_fmt(profile.get(f'{k}_gpu_ms'))} ({_fmt(profile.get(f'{k}_share_pct'))} %)"
              for k in ("recompute", "rebuild", "optimizer")]
    policy = _policy(profile, profile["policy"])
    title = f"Profile of the best step ({policy}, rank 0, median ms per step; shares of compute):"
    return ["", title, "", _line(PROFILE), _line(["---"] * len(PROFILE)), _line(times + shares)]


def table(out: Path) -> str:
    plans = {p["row"]: p for p in _rows(out / "plans.json")}  # the latest run of each row
    lines = [_line(HEADER), _line(["---"] * len(HEADER))]
    for label, stage in ROWS.items():
        plan = plans.get(label, {})
        row = _fsdp_row(out, label)
        peer = _peer_of(out / f"llama-peer-{plan.get('stage', stage)}.jsonl", row)
        lines.append(_ablation_line(label, row, plan.get("checkpoint", "-"),
                                    peer.get("step_median_ms") if peer else None))
    profile = _last_ok(out / "profile-best.jsonl")
    return "\n".join(lines + (_profile_lines(profile) if profile else [])) + "\n"


def main() -> None:
    out = Path(sys.argv[1])
    text = table(out)
    (out / "ablation.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
