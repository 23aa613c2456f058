#!/usr/bin/env bash
# Attention benchmark of issue 5 on one H100, in priority order within a wall-clock budget:
#   leaderboard  the reference workload (batch 1, 16 heads, seq 16384, d 64, bf16, causal, fwd+bwd)
#                with every peer; do_bench's default warmup/rep; float64 check at full size
#   tflops       fwd-only and bwd-only TFLOP/s, d 64 and 128, seq 1k..64k, flash-triton vs SDPA
#   classic-*    the classic grid (batch 8, no head dim, d 16..128, seq 256..16384, fp32 and bf16),
#                do_bench warmup 5 ms / rep 20 ms, float64 check up to seq 2048. Trimmed for the
#                budget: flash-torch (a Python loop over tiles: ~10 s per call at 16384) runs at
#                seq 256 and 1024 only; in fp32, sdpa-flash and sdpa-cudnn (fp16/bf16 kernels) get
#                one row that says so instead of 20 (each failed row restarts the worker, ~3 s).
# Estimate (one reused worker per stage): leaderboard ~45 s, tflops ~90 s, classic bf16 ~150 s,
# classic fp32 ~120 s (naive-compiled compiles per shape: ~3-5 s x 20; flash-triton autotunes per
# head dim and length bucket), flash-torch ~20 s: ~7 min. Each stage gets at most what is left of
# BUDGET_S minus the estimated cost (COST) of the planned stages after it (benchmarks/stages.sh),
# and is stopped with SIGINT at its limit (the finished points are kept; rerun a stage with
# STAGES=... and it resumes where it stopped).
# Usage (repo root, GPU machine, no uv): OUT=/some/dir bash benchmarks/attention/run_gpu.sh
# Writes to $OUT: leaderboard.jsonl, tflops.jsonl, classic.jsonl, classic.png, tflops.png,
# summary.md (tables with ratios, the verdict against the issue's targets).
set -u
OUT=${OUT:-runs/attention-gpu}
BUDGET_S=${BUDGET_S:-470}
STAGES=${STAGES:-"leaderboard tflops classic-bf16 classic-fp32 classic-fp32-unavailable classic-flash-torch"}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
deadline=$((SECONDS + BUDGET_S))

# Estimated seconds per stage on an H100; the summary and its plots get RESERVE_END.
ORDER=(leaderboard tflops classic-bf16 classic-fp32 classic-fp32-unavailable classic-flash-torch)
declare -A COST=([leaderboard]=60 [tflops]=90 [classic-bf16]=150 [classic-fp32]=120
                 [classic-fp32-unavailable]=25 [classic-flash-torch]=60)
RESERVE_END=10
STAGE_MIN_S=15
# shellcheck source=../stages.sh
source "$(dirname "$0")/../stages.sh"

stage() {  # stage NAME ARGS...: lmscope attention ARGS within the stage's limit
  local name=$1
  shift
  run_stage "$name" python3 -m lmscope attention "$@" --resume --no-plot --reuse-worker
}

FAST=(--warmup-ms 5 --rep-ms 20 --check-max-seq 2048 --timeout 120)
CLASSIC_ONE=(--preset classic "${FAST[@]}" --out "$OUT/classic.jsonl")  # a single implementation
CLASSIC=("${CLASSIC_ONE[@]}" --compare impl)
FAST_IMPLS=flash-triton,sdpa-flash,sdpa-cudnn,sdpa-efficient,sdpa-math,naive,naive-compiled
FP32_IMPLS=flash-triton,sdpa-efficient,sdpa-math,naive,naive-compiled

stage leaderboard --preset leaderboard --compare impl --timeout 240 --out "$OUT/leaderboard.jsonl"
stage tflops --preset tflops "${FAST[@]}" --out "$OUT/tflops.jsonl"
stage classic-bf16 "${CLASSIC[@]}" --dtype bf16 --impl "$FAST_IMPLS"
stage classic-fp32 "${CLASSIC[@]}" --dtype fp32 --impl "$FP32_IMPLS"
stage classic-fp32-unavailable "${CLASSIC[@]}" --dtype fp32 --impl sdpa-flash,sdpa-cudnn \
  --head-dim 64 --seq-len 1024
stage classic-flash-torch "${CLASSIC_ONE[@]}" --dtype bf16,fp32 --impl flash-torch --seq-len 256,1024

python3 benchmarks/attention/summarize.py "$OUT"
