#!/usr/bin/env bash
# Issue 34: ten independent CPU runs of one `lmscope bench --rounds` comparison (tiny model, naive
# against SDPA attention, every round of every point in a fresh process). Does each run's
# round-level 95 % interval cover the pooled ratio of the other nine? coverage.py answers it and
# writes the rows and a summary.
# Usage (repo root, no uv): [OUT=benchmarks/results/stats] [RUNS=10] [ROUNDS=5] [PYTHON=python3]
#   bash benchmarks/stats/coverage_runs.sh
# Rerunning with the same OUT resumes (finished rounds are kept).
set -euo pipefail
OUT=${OUT:-benchmarks/results/stats}
RUNS=${RUNS:-10}
ROUNDS=${ROUNDS:-5}
PYTHON=${PYTHON:-python3}
export PYTHONPATH=src PYTHONUNBUFFERED=1
ARGS=(--device cpu --size tiny --context-length 128 --batch-size 2 --mode train-step
      --attention naive,sdpa --warmup 2 --steps 10 --max-time 2 --rounds "$ROUNDS")
mkdir -p "$OUT/bench-runs"
for ((i = 0; i < RUNS; i++)); do
  "$PYTHON" -m lmscope bench "${ARGS[@]}" --out "$OUT/bench-runs/run-$i.jsonl" --resume
done
"$PYTHON" benchmarks/stats/coverage.py "$OUT"/bench-runs/run-*.jsonl --out "$OUT" --field attention --base naive \
  --command "lmscope bench ${ARGS[*]} --out RUN.jsonl"
