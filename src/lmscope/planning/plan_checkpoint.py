"""`lmscope plan checkpoint` and `lmscope plan presets`: plan sections from the accounting.

`checkpoint_sections` lays out `lmscope.accounting.checkpoint_plan`: the setup, the chosen plan
and the table of candidates. With `--from`, the plan starts from a `memory --activations` row
measured without checkpointing (its step peak and the median bytes a block saved).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from lmscope.accounting.checkpoint_plan import (
    DEFAULT_DEVICE,
    MARGIN_PCT,
    TREATMENTS,
    MeasuredSaved,
    plan_checkpointing,
)
from lmscope.accounting.flops import parameter_counts
from lmscope.accounting.memory import GIB
from lmscope.config import PRESETS, ModelConfig, preset
from lmscope.records.results import Record, read_records
from lmscope.report.tables import render

Sections = dict[str, list[Record]]
OVERRIDES = ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")


def presets_sections() -> Sections:
    """Every preset's shape and parameter count (the table in README.md is this, rendered as md)."""
    return {"presets": [preset_record(name, config) for name, config in PRESETS.items()]}


def presets_markdown() -> str:
    """The presets table as markdown: what README.md shows between its `presets` markers."""
    records = presets_sections()["presets"]
    header = list(records[0])
    return render((header, [[r[k] for k in header] for r in records]), "md")


def preset_record(name: str, config: ModelConfig) -> Record:
    return {"preset": name, "d_model": config.d_model, "d_ff": config.d_ff, "layers": config.num_layers,
            "heads": config.num_heads, "vocab": config.vocab_size,
            "parameters": f"{parameter_counts(config)['total']:,}"}


def checkpoint_sections(name: str, config: ModelConfig, *, batch_size: int, seq_len: int, budget: int,
                        mode: str, precision: str, attention: str,
                        measured: MeasuredSaved | None = None, margin_pct: float = MARGIN_PCT,
                        fast: bool = False, world_size: int = 1, treatments: tuple[str, ...] = TREATMENTS,
                        device: str = DEFAULT_DEVICE, host_link_gbps: float | None = None,
                        optimizer_state: str = "device") -> Sections:
    """Setup, the chosen plan and the candidates (policy, blocks per treatment, predicted peak,
    recompute share, time added); `optimizer_state`: where AdamW's moments live under FSDP."""
    plan = plan_checkpointing(config, batch_size=batch_size, seq_len=seq_len, budget=budget, mode=mode,
                              precision=precision, attention=attention, measured=measured,
                              margin_pct=margin_pct, fast=fast, world_size=world_size, treatments=treatments,
                              device=device, host_link_gbps=host_link_gbps, optimizer_state=optimizer_state)
    setup = {"model": name, "num_layers": config.num_layers, "batch_size": batch_size,
             "context_length": seq_len, "mode": mode, "precision": precision, "attention": attention,
             "memory_model": plan.model, "ranks": world_size, "optimizer_state": optimizer_state,
             "device": plan.device, "treatments": ",".join(treatments), "budget_gib": budget / GIB,
             "margin_pct": margin_pct, "usable_gib": budget * (1 - margin_pct / 100) / GIB,
             "source": plan.source}
    if measured is not None:
        setup.update(measured_step_peak_gib=measured.step_peak / GIB,
                     measured_block_saved_mib=measured.block_saved / 2**20)
    run_it = _run_it(plan.chosen.policy, fast, world_size, optimizer_state)
    chosen = {**plan.chosen.as_record(), "run_it": run_it}
    return {"setup": [setup], "chosen": [chosen],
            "candidates": [c.as_record() for c in plan.candidates]}


def _run_it(policy: str, fast: bool, world_size: int, optimizer_state: str) -> str:
    if fast or world_size > 1:
        return (f"lmscope ddp --strategy fsdp --nproc {world_size} {'--fast on ' if fast else ''}"
                f"{'--optimizer-state host ' if optimizer_state == 'host' else ''}--checkpoint {policy}")
    return f"lmscope memory --checkpoint {policy}"


def measured_from(path: Path, **point: Any) -> tuple[str, ModelConfig, dict[str, Any], MeasuredSaved]:
    """The one `memory --activations` row without checkpointing in `path` matching `point`.

    `point` filters on the row's fields (size, batch_size, context_length, precision, attention,
    mode; None = any). Returns the preset name, its config, the row's point fields and the facts.
    """
    rows = [r for r in read_records(path)
            if r.get("workload") == "memory" and r.get("status", "ok") == "ok"
            and r.get("saved_by_block") and r.get("checkpoint", "none") == "none"]
    for key, value in point.items():
        if value is not None:
            rows = [r for r in rows if str(r.get(key)).lower() == str(value).lower()]
    if len(rows) != 1:
        found = "no" if not rows else f"{len(rows)}"
        raise ValueError(f"{path} has {found} memory --activations rows without checkpointing that match: "
                         "measure one with `lmscope memory --activations on`, or pick one with --model, "
                         "--batch-size, --context-length, --precision, --attention, --mode")
    row = rows[0]
    config = preset(row["size"], **{k: row.get(k) for k in OVERRIDES},
                    context_length=row.get("model_context_length") or row["context_length"])
    blocks = [b["saved_mib"] for b in row["saved_by_block"] if str(b["block"]).startswith("layers.")]
    if not blocks or row.get("step_peak_gib") is None:
        raise ValueError(f"{path}: the matching row has no per-block saved bytes or step peak")
    facts = MeasuredSaved(step_peak=round(row["step_peak_gib"] * GIB),
                          block_saved=round(statistics.median(blocks) * 2**20))
    fields = {k: row[k] for k in ("batch_size", "context_length", "mode", "precision", "attention")}
    return row["size"], config, fields, facts
