"""Reading what a report shows: a run folder (every results JSONL in it, and study.json) or files."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmscope.records.results import Record
from lmscope.records.results_check import read_rows


@dataclass
class Run:
    """The records of one run, the folder their artifacts are under, and the study manifest."""

    label: str
    base: Path
    records: list[Record] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    """What reading left out (lines that hold no row, files without lmscope rows), one line each."""

    def by_workload(self) -> dict[str, list[Record]]:
        """Records grouped by `workload`, in first-seen order (records without one are left out)."""
        groups: dict[str, list[Record]] = {}
        for record in self.records:
            if record.get("workload"):
                groups.setdefault(str(record["workload"]), []).append(record)
        return groups


def load_run(path: Path) -> Run:
    """A run from a folder (its *.jsonl, rank files left out, and study.json) or one JSONL file.

    ValueError when it holds no lmscope rows (an empty, plain-text or foreign file); lines and
    files left out on the way are in `Run.notes`.
    """
    if not path.exists():
        raise FileNotFoundError(f"no results at {path}: pass a run folder or a results.jsonl")
    if not path.is_dir():
        rows = read_rows(path)
        return Run(label=path.stem if path.stem != "results" else path.parent.name, base=path.parent,
                   records=rows.records, notes=rows.notes)
    files = sorted(p for p in path.glob("*.jsonl") if ".rank" not in p.name)
    if not files:
        raise ValueError(f"{path} holds no results (*.jsonl): pass a run folder of lmscope")
    manifest_path = path / "study.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    run = Run(label=path.name, base=path, manifest=manifest)
    for file in files:
        try:
            rows = read_rows(file)
        except ValueError as error:
            run.notes.append(f"left out {error}")
            continue
        run.records.extend({**r, "_file": file.name} for r in rows.records)
        run.notes.extend(rows.notes)
    if not run.records:
        raise ValueError(f"{path} holds no lmscope rows in its {len(files)} results file(s): "
                         "pass a run folder of lmscope")
    return run


def artifact(run: Run, recorded: str | None) -> Path | None:
    """A file a record points to: its recorded path, or the same last three parts under the run."""
    if not recorded:
        return None
    path = Path(recorded)
    if path.is_file():
        return path
    for depth in (3, 2, 1):
        candidate = run.base.joinpath(*path.parts[-depth:])
        if candidate.is_file():
            return candidate
    return None
