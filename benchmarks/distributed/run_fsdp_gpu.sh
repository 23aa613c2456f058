#!/usr/bin/env bash
# FSDP measurements (lmscope.parallel.fsdp vs PyTorch FSDP2), from the repo root:
#   OUT=/some/dir STAGES=single bash benchmarks/distributed/run_fsdp_gpu.sh      # one H100
#   OUT=/some/dir STAGES=x2,long,peer bash benchmarks/distributed/run_fsdp_gpu.sh  # 2x H200
#   OUT=/some/dir STAGES=overlap bash benchmarks/distributed/run_fsdp_gpu.sh  # 2x H100 or H200, < 9.5 min
# Stages (comma-separated in STAGES), each under `timeout` of its own budget (seconds, *_S):
#   single  (a) one GPU: the 8B long-context shape reduced to SINGLE_LAYERS layers (default 4),
#           context 32768, batch 1: fsdp and torch-fsdp2 at world size 1 with --fast on and
#           --checkpoint block, beside the single baseline (same fast model, unsharded AdamW); then
#           the GPU tests of the FSDP code (tests/parallel/test_parallel_fsdp_gpu.py). SINGLE_S=540.
#   x2      (b) X_NPROC ranks (default 2; 4 on nvidia-h200-x4): xl and 2.7B, bf16, context 512,
#           batch 4 per rank, strategies fsdp, torch-fsdp2, coalesced:1000 in one run (plus the
#           single baseline). X2_S=580 per size; X_SIZES=xl,2.7B (one size per call keeps a
#           call under the device tool's 10 minutes: X_SIZES=xl, then X_SIZES=2.7B).
#   overlap (issue 37) X_NPROC ranks, OVERLAP_SIZE (xl), bf16, context OVERLAP_CONTEXT (512), batches OVERLAP_BATCHES
#           (default 4,8: the study's batch, where the host bounds the eager step, and 8, where the
#           GPU does and the single-GPU step still fits 80 GB): OVERLAP_STRATEGIES (default fsdp,
#           torch-fsdp2, coalesced:1000; add fsdp:separate-reduce for the reduce-scatters on a group
#           of their own) and the single step in OVERLAP_ROUNDS interleaved rounds (default 2),
#           OVERLAP_TIMED_S (default 330); then OVERLAP_PROFILED (default fsdp; a comma list) and
#           the single step at the same batches again with
#           OVERLAP_PROFILE_STEPS (default 2) profiled steps each (lmscope ddp --profile-steps: per
#           rank, compute, exposed communication, idle, host time in the hooks, traces in
#           $OUT/ddp-profile), in what is left of OVERLAP_S (default 540).
#   long    the 8B long-context step (d 4096, d_ff 11008, 34 layers, 32 heads, vocab 151936),
#           context 32768, batch 1 per rank on 2 ranks: fsdp with --fast on, fused AdamW, once per
#           attention in LONG_ATTENTIONS (default flash; sdpa-cudnn is cuDNN's kernel) and
#           --checkpoint LONG_CHECKPOINT (default block; blocks:0-26 keeps the last 7 blocks'
#           activations). LONG_S=580 per attention.
#   peer    its peer in the same session: transformers' Llama (SDPA), full activation
#           checkpointing, fully_shard per layer, bf16 params, fp32 reduce, foreach AdamW
#           (benchmarks/distributed/llama_fsdp2_peer.py). PEER_S=580.
# Writes into $OUT: log.txt, fsdp-single.jsonl/.md, fsdp-xl-x2.jsonl/.md, fsdp-2.7B-x2.jsonl/.md,
# fsdp-8b-<attention>.jsonl/.md (each with .summary.md and .fsdp.md: memory per rank beside the accounting),
# overlap-<size>-x<N>.jsonl and overlap-<size>-x<N>-profile.jsonl (with .md, .summary.md, .fsdp.md, .profile.md),
# llama-peer.jsonl. The long stage's paired unwrapped step and single baseline run out of
# memory at 8B (an oom row, and local_step_ms None): expected, they cost one step each.
set -uo pipefail
OUT=${OUT:-runs/fsdp-gpu}
mkdir -p "$OUT"
export PYTHONPATH=src
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
STAGES=${STAGES:-single}
X_SIZES=${X_SIZES:-xl,2.7B}
LM=(python3 -m lmscope)
B8=(--d-model 4096 --d-ff 11008 --num-heads 32 --vocab-size 151936 --context-length 32768
    --batch-size 1 --precision bf16)
stage() { [[ ",$STAGES," == *",$1,"* ]]; }
run() { echo "+ $*" | tee -a "$OUT/log.txt"; "$@" 2>&1 | tee -a "$OUT/log.txt"; }

if stage single; then
  run timeout "${SINGLE_S:-540}" "${LM[@]}" ddp --size small "${B8[@]}" --num-layers "${SINGLE_LAYERS:-4}" \
    --fast on --attention flash --checkpoint block --nproc 1 --strategy fsdp,torch-fsdp2 \
    --warmup 2 --steps 5 --timeout 400 --out "$OUT/fsdp-single.jsonl" --format md
  run timeout 300 python3 -m pytest -q tests/parallel/test_parallel_fsdp_gpu.py
fi
if stage x2; then
  for size in ${X_SIZES//,/ }; do
    run timeout "${X2_S:-580}" "${LM[@]}" ddp --size "$size" --context-length 512 --batch-size 4 \
      --precision bf16 --nproc "${X_NPROC:-2}" --strategy fsdp,torch-fsdp2,coalesced:1000 \
      --warmup "${X_WARMUP:-5}" --steps "${X_STEPS:-20}" --timeout 200 --out "$OUT/fsdp-$size-x${X_NPROC:-2}.jsonl" --format md
  done
fi
if stage overlap; then
  began=$SECONDS
  size=${OVERLAP_SIZE:-xl}
  name="$OUT/overlap-$size-x${X_NPROC:-2}"
  XO=(--size "$size" --context-length "${OVERLAP_CONTEXT:-512}" --batch-size "${OVERLAP_BATCHES:-4,8}"
      --precision bf16 --nproc "${X_NPROC:-2}" --timeout 200 --format md)
  run timeout "${OVERLAP_TIMED_S:-330}" "${LM[@]}" ddp "${XO[@]}" --strategy "${OVERLAP_STRATEGIES:-fsdp,torch-fsdp2,coalesced:1000}" \
    --rounds "${OVERLAP_ROUNDS:-2}" --warmup 3 --steps 10 --out "$name.jsonl"
  rest=$(( ${OVERLAP_S:-540} - (SECONDS - began) ))
  if (( rest > 30 )); then
    run timeout "$rest" "${LM[@]}" ddp "${XO[@]}" --strategy "${OVERLAP_PROFILED:-fsdp}" --profile-steps "${OVERLAP_PROFILE_STEPS:-2}" \
      --warmup 3 --steps 5 --out "$name-profile.jsonl"
  else
    echo "overlap: no time left to profile ($rest s)" | tee -a "$OUT/log.txt"
  fi
fi
if stage long; then
  for attention in ${LONG_ATTENTIONS:-flash}; do
    run timeout "${LONG_S:-580}" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "${LM[@]}" ddp \
      --size small "${B8[@]}" --num-layers 34 --fast on --attention "$attention" \
      --checkpoint "${LONG_CHECKPOINT:-block}" --nproc 2 --strategy fsdp --warmup 1 --steps 3 \
      --timeout 500 --out "$OUT/fsdp-8b-$attention.jsonl" --format md
  done
fi
if stage peer; then
  run timeout "${PEER_S:-580}" python3 benchmarks/distributed/llama_fsdp2_peer.py --nproc 2 \
    --warmup 1 --steps 3 --timeout 540 --out "$OUT/llama-peer.jsonl"
fi
