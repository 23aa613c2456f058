#!/usr/bin/env bash
# lmscope on models that are not its own (issue 17) on one H100: bench, profile and memory rows for
#   hf:gpt2                                   transformers' GPT-2 (124M shape), random weights, SDPA
#   hf:examples/llama-3.2-1b-shape.json       a Llama-3.2-1B shape from its config, random weights, SDPA
#   examples/own_lm.py:build                  a custom nn.Module LM from a file (GPT-2-small sizes)
# at context 1024 (GPT-2 batch 8, Llama batch 4) and 4096 (GPT-2 batch 2, Llama batch 1), fp32/bf16,
# eager and torch.compile, in priority order within a wall-clock budget (stages stop with SIGINT at
# their share; finished points are kept; rerun with STAGES=... to resume). GPT-2 at 4096 gets a
# position table of 4096 rows (lmscope raises it to the context). FLOPs/MFU of these sources come
# from the FLOP counter where it is merged (analytic FLOPs are for lmscope's presets).
# Estimate: ~8 min on an H100 (compiled points ~30-60 s each, eager ~10-15 s).
# Usage (repo root, GPU machine, no uv): OUT=/some/dir bash benchmarks/own_model/run_gpu.sh
# Writes to $OUT: bench.jsonl, profile.jsonl, memory.jsonl, summary.md, log.txt.
set -u
OUT=${OUT:-runs/own-model-gpu-out}
RUN=${RUN:-runs/own-model-gpu}
BUDGET_S=${BUDGET_S:-470}
STAGES=${STAGES:-"bench-gpt2 bench-llama bench-own bench-4096 profile memory bench-4096-fp32"}
STAGES=$(echo $STAGES)
mkdir -p "$OUT" "$RUN"
export PYTHONPATH=src PYTHONUNBUFFERED=1
deadline=$((SECONDS + BUDGET_S))
exec > >(tee -a "$OUT/log.txt") 2>&1

# shellcheck source=../reserve_stage.sh
source "$(dirname "$0")/../reserve_stage.sh"

GPT2=(--model hf:gpt2 --attention sdpa)
LLAMA=(--model hf:examples/llama-3.2-1b-shape.json --attention sdpa)
OWN=(--model examples/own_lm.py:build)
BENCH=(python3 -m lmscope bench --warmup 5 --steps 10 --timeout 300 --resume --reuse-worker
       --out "$RUN/bench.jsonl")
PROFILE=(python3 -m lmscope profile --warmup 3 --steps 3 --timeout 300 --resume --out "$RUN/profile.jsonl")
MEMORY=(python3 -m lmscope memory --warmup 2 --steps 2 --timeout 300 --resume --out "$RUN/memory.jsonl")

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
stage bench-gpt2 330 "${BENCH[@]}" "${GPT2[@]}" --context-length 1024 --batch-size 8 \
  --precision bf16,fp32 --compile off,on
stage bench-llama 220 "${BENCH[@]}" "${LLAMA[@]}" --context-length 1024 --batch-size 4 \
  --precision bf16,fp32 --compile off,on
stage bench-own 170 "${BENCH[@]}" "${OWN[@]}" --context-length 1024 --batch-size 8 \
  --precision bf16,fp32 --compile off,on
stage bench-4096 120 "${BENCH[@]}" "${GPT2[@]}" --context-length 4096 --batch-size 2 \
  --precision bf16 --compile off,on
stage bench-4096 100 "${BENCH[@]}" "${LLAMA[@]}" --context-length 4096 --batch-size 1 \
  --precision bf16 --compile off,on
stage profile 70 "${PROFILE[@]}" "${GPT2[@]}" --context-length 1024 --batch-size 8 --precision bf16
stage profile 55 "${PROFILE[@]}" "${LLAMA[@]}" --context-length 1024 --batch-size 4 --precision bf16
stage profile 40 "${PROFILE[@]}" "${OWN[@]}" --context-length 1024 --batch-size 8 --precision bf16
stage memory 25 "${MEMORY[@]}" "${GPT2[@]}" --context-length 1024 --batch-size 8 --precision bf16,fp32 \
  --snapshot off
stage memory 10 "${MEMORY[@]}" "${LLAMA[@]}" --context-length 1024 --batch-size 4 --precision bf16 \
  --checkpoint none,block --snapshot off
stage bench-4096-fp32 0 "${BENCH[@]}" "${GPT2[@]}" --context-length 4096 --batch-size 2 --precision fp32

for name in bench profile memory; do
  [[ -f "$RUN/$name.jsonl" ]] && cp "$RUN/$name.jsonl" "$OUT/$name.jsonl"
done
python3 benchmarks/own_model/summarize.py "$OUT" > "$OUT/summary.md"
echo "== done in $SECONDS s: $OUT"
