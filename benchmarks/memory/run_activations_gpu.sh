#!/usr/bin/env bash
# Saved activations per block and the checkpointing planner (issue 20, items 4-5) on one H100.
# Stages, in this order (the later ones are cut first when time runs out):
#   gpu-tests    tests/measure/test_saved_activations_gpu.py (small bf16: blocks within 5 %, a plan)
#   plan         plan checkpoint for xl-2025 (the newer edition's xl), batch 4, context 2048, bf16,
#                SDPA, forward-backward, 40 GiB (JSON to $OUT), then memory --checkpoint
#                "none;plan:40GiB": the chosen plan's peak and step time beside no checkpointing
#                (targets: fits 40 GiB, within 10 % of its prediction). No plan fits a train-step in
#                40 GiB: fp32 weights, gradients and AdamW state of 3.4 B parameters are 16 bytes
#                each before any activation (plan checkpoint says so and exits 2).
#   blocks-sdpa  memory --activations on: small..2.7B at context 512 and 2048, bf16, SDPA (flash),
#                batch 4, forward-backward: bytes per block vs the formula (target: within 5 %)
#   blocks-naive the same with naive attention where it fits (512: all sizes; 2048: small, medium)
#   blocks-more  small and medium with lmscope's Triton flash attention (bf16) and with fp32 SDPA
#                (torch's memory-efficient kernel), at 512 and 2048
# Every point: a fresh process, 1 warm-up and 2 measured steps (the plan: 2 and 5), no snapshot.
# Estimate: ~15 s per point; 4 tests + 2 + 10 + 7 + 8 points: ~6 min. Stages stop at their share of
# BUDGET_S (finished points are kept; rerun with STAGES=... to resume).
# Usage (repo root, GPU machine, no uv): OUT=/some/dir bash benchmarks/memory/run_activations_gpu.sh
# Writes to $OUT: results.jsonl, plan_xl-2025.json, summary.md, log.txt.
set -u
OUT=${OUT:-runs/activations-gpu-out}
RUN=${RUN:-runs/activations-gpu}
BUDGET_S=${BUDGET_S:-360}
STAGES=${STAGES:-"gpu-tests plan blocks-sdpa blocks-naive blocks-more"}
STAGES=$(echo $STAGES)
mkdir -p "$OUT" "$RUN"
export PYTHONPATH=src PYTHONUNBUFFERED=1
RESULTS="$RUN/results.jsonl"
deadline=$((SECONDS + BUDGET_S))

# shellcheck source=../reserve_stage.sh
source "$(dirname "$0")/../reserve_stage.sh"

MEMORY=(python3 -m lmscope memory --warmup 1 --steps 2 --snapshot off --timeout 200 --resume --out "$RESULTS"
        --batch-size 4 --precision bf16 --mode forward-backward)
XL=(--batch-size 4 --context-length 2048 --precision bf16 --attention sdpa --mode forward-backward)

main() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

  stage gpu-tests 290 python3 -m pytest -m gpu tests/measure/test_saved_activations_gpu.py -q -p no:cacheprovider
  python3 -m lmscope plan checkpoint --model xl-2025 "${XL[@]}" --budget 40GiB --format json \
    > "$OUT/plan_xl-2025.json"
  python3 -m lmscope plan checkpoint --model xl-2025 "${XL[@]}" --budget 40GiB --format md | head -20
  stage plan 210 python3 -m lmscope memory --size xl-2025 "${XL[@]}" --checkpoint "none;plan:40GiB" \
    --warmup 2 --steps 5 --snapshot off --timeout 200 --resume --out "$RESULTS"
  stage blocks-sdpa 60 "${MEMORY[@]}" --size small,medium,large,xl,2.7B --context-length 512,2048 \
    --attention sdpa --activations on
  stage blocks-naive 45 "${MEMORY[@]}" --size small,medium,large,xl,2.7B --context-length 512 \
    --attention naive --activations on
  stage blocks-naive 35 "${MEMORY[@]}" --size small,medium --context-length 2048 --attention naive \
    --activations on
  stage blocks-more 0 "${MEMORY[@]}" --size small,medium --context-length 512,2048 --attention flash \
    --activations on
  stage blocks-more 0 python3 -m lmscope memory --warmup 1 --steps 2 --snapshot off --timeout 200 --resume \
    --out "$RESULTS" --batch-size 4 --precision fp32 --mode forward-backward --size small,medium \
    --context-length 512,2048 --attention sdpa --activations on

  cp "$RESULTS" "$OUT/results.jsonl" 2>/dev/null
  python3 benchmarks/memory/summarize_activations.py "$RESULTS" "$OUT/summary.md"
}

set -o pipefail
main 2>&1 | tee "$OUT/log.txt"
