#!/usr/bin/env bash
# End-to-end step sweep of issue 2 on one GPU: sizes small..2.7B x context 128..1024 x fp32/bf16
# x forward / forward-backward / train-step at batch 4, then the warm-up study.
# Usage (repo root, on the GPU machine): OUT=/some/dir bash benchmarks/bench/run_gpu.sh [budget_s]
# Sweep (a) reuses one worker process across points (each point still warms up); the warm-up
# study (b) starts a fresh process per point, since cold start is what it measures.
# Interrupted runs resume: points already in $OUT/bench.jsonl are skipped.
set -u
OUT=${OUT:-runs/gpu}
BUDGET=${1:-540}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
start=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - start) )); }
timeout -s INT "$(left)" python3 -m lmscope bench \
  --size small,medium,large,xl,2.7B --context-length 128,256,512,1024 \
  --precision fp32,bf16 --mode forward,forward-backward,train-step --batch-size 4 \
  --warmup 5 --steps 10 --timeout 240 --out "$OUT/bench.jsonl" --resume --format md --reuse-worker
if [ "$(left)" -gt 30 ]; then
  timeout -s INT "$(left)" python3 -m lmscope bench --size medium --context-length 512 \
    --mode train-step --precision fp32 --warmup 0,1,2,5 --steps 10 \
    --out "$OUT/bench_warmup.jsonl" --resume --format md
fi
