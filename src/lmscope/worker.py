"""Entry point of one isolated point: `python -m lmscope.worker WORKLOAD SPEC_JSON RESULT_JSON`.

Runs the workload on the spec and writes its metrics (or its failure as a status) to
RESULT_JSON. A crash that kills the interpreter leaves no result file; the runner then records
the point as an error with the end of this process's output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lmscope.runner import run_in_process


def main(argv: list[str]) -> int:
    workload, spec_path, result_path = argv
    spec = json.loads(Path(spec_path).read_text())
    result = run_in_process(workload, spec)
    Path(result_path).write_text(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
