#!/usr/bin/env bash
# lmscope memory (issue 4) on one H100, in priority order within a wall-clock budget:
#   gpu-tests      tests/measure/test_memory_gpu.py: small model within 10 % of the model, snapshots
#                  read back (record_memory_history / _dump_snapshot of the torch installed here)
#   tiny           the tiny model's train-step snapshot, copied to $OUT to be committed as a fixture
#   2.7B-timeline  2.7B ctx 512 fp32, forward and train-step, with snapshots: timeline PNGs, top allocations
#   2.7B-peaks     2.7B forward and train-step at ctx 128/256 (fp32, bf16) and 512 (bf16): peak per
#                  phase, measured vs predicted (with 2.7B-timeline: the full 12-point table)
#   xl-checkpoint  xl ctx 512 bf16 train-step, --checkpoint none vs block: peak and step time
#   sweep-*        the model's accuracy: small/medium/large train-step, fp32/bf16, naive/sdpa
# Every point: 2 warm-up steps, 2 measured steps, a fresh process (the allocator's own state).
# Estimate: ~10-15 s per 2.7B point, ~6-8 s per small point: ~6 min; stages are stopped with SIGINT
# at their share of BUDGET_S (finished points are kept; rerun with STAGES=... to resume).
# Usage (repo root, GPU machine, no uv): OUT=/some/dir bash benchmarks/memory/run_gpu.sh
# Writes to $OUT: results.jsonl, summary.md, timeline_2.7B_forward.png, timeline_2.7B_train_step.png,
# tiny_snapshot.pickle, log.txt. Snapshots of the big points stay in $RUN/memory (too large to return).
set -u
OUT=${OUT:-runs/memory-gpu-out}
RUN=${RUN:-runs/memory-gpu}
BUDGET_S=${BUDGET_S:-360}
STAGES=${STAGES:-"gpu-tests tiny 2.7B-timeline 2.7B-peaks 2.7B-peaks-512 xl-checkpoint sweep-small
  sweep-large sweep-medium"}
STAGES=$(echo $STAGES)  # one space between names
mkdir -p "$OUT" "$RUN"
export PYTHONPATH=src PYTHONUNBUFFERED=1
RESULTS="$RUN/results.jsonl"
deadline=$((SECONDS + BUDGET_S))

# shellcheck source=../reserve_stage.sh
source "$(dirname "$0")/../reserve_stage.sh"

MEMORY=(python3 -m lmscope memory --warmup 2 --steps 2 --timeout 240 --resume --out "$RESULTS")
SIZE_2_7B=(--size 2.7B --mode forward,train-step)
SWEEP=(--mode train-step --precision fp32,bf16 --attention naive,sdpa --snapshot off)

copy_png() {  # copy_png SLUG_PREFIX NAME: the timeline of the first point folder matching the prefix
  local png
  png=$(ls -d "$RUN"/memory/"$1"*/timeline.png 2>/dev/null | head -1)
  if [[ -n "$png" ]]; then cp "$png" "$OUT/$2"; else echo "no timeline for $1"; fi
}

main() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

  stage gpu-tests 290 python3 -m pytest -m gpu tests/measure/test_memory_gpu.py -q -p no:cacheprovider
  stage tiny 270 "${MEMORY[@]}" --size tiny --context-length 128 --mode train-step --precision fp32 --top 5
  local snap
  snap=$(ls -d "$RUN"/memory/tiny-ctx128-b4-train-step-fp32-naive-*/snapshot.pickle 2>/dev/null | head -1)
  if [[ -n "$snap" ]]; then cp "$snap" "$OUT/tiny_snapshot.pickle"; fi

  stage 2.7B-timeline 190 "${MEMORY[@]}" "${SIZE_2_7B[@]}" --context-length 512 --precision fp32
  copy_png "2.7B-ctx512-b4-forward-fp32-naive-" timeline_2.7B_forward.png
  copy_png "2.7B-ctx512-b4-train-step-fp32-naive-" timeline_2.7B_train_step.png
  stage 2.7B-peaks 110 "${MEMORY[@]}" "${SIZE_2_7B[@]}" --context-length 128,256 --precision fp32,bf16 \
    --snapshot off
  stage 2.7B-peaks-512 95 "${MEMORY[@]}" "${SIZE_2_7B[@]}" --context-length 512 --precision bf16 --snapshot off
  stage xl-checkpoint 80 "${MEMORY[@]}" --size xl --context-length 512 --mode train-step --precision bf16 \
    --checkpoint none,block --snapshot off
  stage sweep-small 45 "${MEMORY[@]}" --size small --context-length 128,1024 "${SWEEP[@]}"
  stage sweep-large 15 "${MEMORY[@]}" --size large --context-length 128,1024 "${SWEEP[@]}"
  stage sweep-medium 0 "${MEMORY[@]}" --size medium --context-length 512 "${SWEEP[@]}"

  cp "$RESULTS" "$OUT/results.jsonl" 2>/dev/null
  python3 benchmarks/memory/summarize.py "$RESULTS" "$OUT/summary.md"
}

set -o pipefail
main 2>&1 | tee "$OUT/log.txt"
