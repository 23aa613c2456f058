#!/usr/bin/env bash
# The 8B long-context step, one row per change (issue 37), on 2x H200, from the repo root:
#   OUT=/some/dir STAGES=a bash benchmarks/distributed/run_8b_ablation.sh   # call 1
#   OUT=/some/dir STAGES=b bash benchmarks/distributed/run_8b_ablation.sh   # call 2
#   OUT=/some/dir STAGES=c ROWS="selective best" bash benchmarks/distributed/run_8b_ablation.sh  # rows again
# The shape and run are the long stage's of run_fsdp_gpu.sh: d 4096, d_ff 11008, 34 layers, 32 heads,
# vocab 151936, context 32768, batch 1 per rank, 2 ranks, bf16, lmscope FSDP, --fast on, our flash
# attention, --warmup 1 --steps 3. The rows (each one `lmscope ddp` run under `timeout ROW_S`,
# default 130 s: one run, the single baseline's out-of-memory row included, took 60-90 s):
#   full       --checkpoint block
#   planned    the planner's fastest plan with full checkpointing only (lmscope plan checkpoint
#              --fast on --fsdp 2 --budget $BUDGET --treatments full)
#   selective  the planner's fastest with full checkpointing and selective recompute
#   offload    the planner's fastest with full checkpointing and offload
#   best       the planner's fastest with all three
# Stage a: the peer (benchmarks/distributed/llama_fsdp2_peer.py, PEER_S=130), full, planned, selective.
# Stage b: the peer, offload, best, and a profile of best (profile_fsdp_step.py, PROFILE_S=150).
# Stage c: the peer and the rows named in ROWS again (after a fix, say), each row then compared
# with this call's peer (plans.json records the stage that ran each row).
# Stage p: the profile of best again (profile_fsdp_step.py, PROFILE_S=150), after stage c, say.
# FSDP_STRATEGY (default fsdp; fsdp:separate-reduce puts the reduce-scatters on a process group of
# their own) is the `lmscope ddp --strategy` of every row the call runs; ATTENTION (default flash,
# lmscope's kernels; sdpa-cudnn: SDPA's cuDNN kernels in the same fast model) its --attention, for
# the planner's plans too; OPTIMIZER_STATE (default device; host: AdamW's moments in pinned host
# memory, each unit updated in the backward) its --optimizer-state, for the planner too; the
# summary shows each where it is not the default.
# BUDGET (default 139GiB: an H200 as torch sees it) with the planner's default 5 % margin; DEVICE
# (default H200) prices the treatments. Writes into $OUT: plans.json (the planner's choices),
# ablation-<row>.jsonl (lmscope ddp rows), llama-peer-<stage>.jsonl, profile-best.jsonl (and its
# trace), log.txt, and ablation.md (benchmarks/distributed/summarize_8b_ablation.py, after each stage).
set -uo pipefail
OUT=${OUT:-runs/ablation-8b}
mkdir -p "$OUT"
export PYTHONPATH=src
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
STAGES=${STAGES:-a}
BUDGET=${BUDGET:-139GiB}
DEVICE=${DEVICE:-H200}
FSDP_STRATEGY=${FSDP_STRATEGY:-fsdp}
ATTENTION=${ATTENTION:-flash}
OPTIMIZER_STATE=${OPTIMIZER_STATE:-device}
DIMS=(--d-model 4096 --d-ff 11008 --num-heads 32 --vocab-size 151936 --num-layers 34)
B8=("${DIMS[@]}" --context-length 32768 --batch-size 1 --precision bf16)
stage() { [[ ",$STAGES," == *",$1,"* ]]; }
run() { echo "+ $*" | tee -a "$OUT/log.txt"; "$@" 2>&1 | tee -a "$OUT/log.txt"; }
plan() {  # the planner's chosen policy with these treatments
  python3 -m lmscope plan checkpoint --model small "${B8[@]}" --attention "$ATTENTION" --fast on --fsdp 2 \
    --optimizer-state "$OPTIMIZER_STATE" \
    --budget "$BUDGET" --device "$DEVICE" --treatments "$1" --format json \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["sections"]["chosen"][0]["policy"])'
}
policy() {
  case "$1" in
    full) echo block ;;
    planned) plan full ;;
    selective) plan full,selective ;;
    offload) plan full,offload ;;
    best) plan full,selective,offload ;;
  esac
}
row() {  # one lmscope ddp run: the row's label and the stage that runs it
  local label=$1 checkpoint
  checkpoint=$(policy "$label")
  echo "{\"row\": \"$label\", \"checkpoint\": \"$checkpoint\", \"stage\": \"$2\", \"strategy\": \"$FSDP_STRATEGY\"," \
    "\"attention\": \"$ATTENTION\", \"optimizer_state\": \"$OPTIMIZER_STATE\"}" >> "$OUT/plans.json"
  run timeout "${ROW_S:-130}" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 -m lmscope ddp \
    --size small "${B8[@]}" --fast on --attention "$ATTENTION" --checkpoint "$checkpoint" --nproc 2 \
    --strategy "$FSDP_STRATEGY" --optimizer-state "$OPTIMIZER_STATE" --warmup 1 --steps 3 --timeout 120 \
    --out "$OUT/ablation-$label.jsonl" --format md
}
peer() {
  run timeout "${PEER_S:-130}" python3 benchmarks/distributed/llama_fsdp2_peer.py --nproc 2 \
    --warmup 1 --steps 3 --timeout 120 --out "$OUT/llama-peer-$1.jsonl"
}
profile_best() {  # the best plan's step under the profiler: compute, exposed communication, recompute
  run timeout "${PROFILE_S:-150}" env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    python3 benchmarks/distributed/profile_fsdp_step.py --nproc 2 "${DIMS[@]}" --context-length 32768 \
    --batch-size 1 --attention "$ATTENTION" --checkpoint "$(policy best)" --strategy "$FSDP_STRATEGY" \
    --optimizer-state "$OPTIMIZER_STATE" --warmup 1 --steps 1 --timeout 140 --out "$OUT/profile-best.jsonl"
}
summary() { run python3 benchmarks/distributed/summarize_8b_ablation.py "$OUT"; }

if stage a; then
  peer a
  for label in full planned selective; do row "$label" a; done
  summary
fi
if stage b; then
  peer b
  for label in offload best; do row "$label" b; done
  profile_best
  summary
fi
if stage c; then
  peer c
  for label in ${ROWS:?stage c runs the rows named in ROWS, e.g. ROWS=\"selective best\"}; do row "$label" c; done
  summary
fi
if stage p; then
  profile_best
  summary
fi
