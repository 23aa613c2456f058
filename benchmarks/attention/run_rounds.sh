#!/usr/bin/env bash
# The attention headlines in interleaved rounds (issue 34): lmscope's FlashAttention (flash-triton)
# against SDPA's flash and cuDNN kernels, forward+backward, bf16, causal, at the leaderboard shape
# and issue 19's other five shapes. Each shape is one `lmscope attention --rounds ROUNDS` call:
# every round runs the three implementations in one fresh worker process, so the variation
# between processes (clocks, allocator, autotuning) enters the intervals that resample rounds.
# Usage (repo root, GPU machine, no uv): OUT=/some/dir [ROUNDS=3] [REP_MS=300] [BUDGET_S=280]
#   bash benchmarks/attention/run_rounds.sh
# Writes $OUT/rounds.jsonl (one row per implementation, shape and round) and $OUT/log.txt; a
# shape whose turn comes after BUDGET_S is skipped (rerun with the same OUT: --resume keeps rows).
set -u
OUT=${OUT:-runs/attention-rounds}
ROUNDS=${ROUNDS:-3}
REP_MS=${REP_MS:-300}
BUDGET_S=${BUDGET_S:-280}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
A=(--impl flash-triton,sdpa-flash,sdpa-cudnn --dtype bf16 --causal on --passes fwd_bwd --check-max-seq 2048
   --rounds "$ROUNDS" --rep-ms "$REP_MS" --reuse-worker --no-plot --timeout 120 --resume
   --out "$OUT/rounds.jsonl")
for shape in "1 16 16384 64" "1 16 8192 128" "1 16 32768 128" "8 16 1024 64" "4 25 512 64" "4 32 512 80"; do
  set -- $shape
  left=$((BUDGET_S - SECONDS))
  if ((left < 20)); then
    echo "== batch $1 heads $2 seq $3 d $4: skipped, the budget is spent ($SECONDS s elapsed)"
    continue
  fi
  echo "== batch $1 heads $2 seq $3 d $4 ($SECONDS s elapsed)"
  timeout -s INT -k 10 "$left" python3 -m lmscope attention "${A[@]}" --batch "$1" --heads "$2" \
    --seq-len "$3" --head-dim "$4" | tail -8
done
