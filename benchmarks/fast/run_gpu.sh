#!/usr/bin/env bash
# The fast training step of issue 8 on one H100, in priority order within a wall-clock budget:
#   tests     the gpu-marked tests of the fused kernels and of FastTransformerLM (real sizes)
#   xl-*      xl, batch 4, context 512, bf16, train step: fast (CUDA graphs), fast with the optimizer
#             inside the backward (--optimizer-in-backward on), fast without graphs, HF peer,
#             torch.compile (sdpa), eager sdpa, eager naive
#   sizes-*   fast (optimizer separate and in the backward), sdpa and HF rows for small, medium,
#             large and 2.7B
#   long-*    large at context 8192 and 16384, batch 1: fast (both optimizer modes), fast with
#             PyTorch's SDPA in place of our FlashAttention (long-fast-sdpa), eager sdpa, HF
#   kernels   where the time of the fast xl step goes (lmscope profile --fast: eager launches, so
#             the kernel table is the graph's kernels); kernels-inbwd: the same with the optimizer
#             inside the backward
#   then, with what is left: eager naive rows, torch.compile at long context and for other sizes
# torch.compile costs ~60-130 s per size (xl: 131 s on the H100), so the compile rows of the other
# sizes need a second call with a fresh OUT, which measures the fast rows again beside them (ratios
# come from one run): STAGES="sizes-fast compile-sizes long-fast long-compile" OUT=... BUDGET_S=520.
# The selected stages whose estimated costs (COST below) fit in BUDGET_S (470 s), taken in order,
# are planned; each stage gets at most what is left minus the cost of the planned stages after it
# (benchmarks/stages.sh), so a stage never starves an earlier one, and is stopped with SIGINT at
# its limit (finished points are kept; rerun with STAGES="..." to resume a stage).
# Usage (repo root, GPU machine, no uv): OUT=/some/dir bash benchmarks/fast/run_gpu.sh
# Writes to $OUT: bench.jsonl, long.jsonl, pytest_gpu.txt, kernels.md and kernels_inbwd.md (with
# profile/ and profile_inbwd/), log.txt (every command's terminal output), copy_bandwidth.jsonl (the
# GPU's copy bandwidth, for the optimizer's floor), summary.md (ratios and the targets, from the rows
# alone), printed last.
set -u
OUT=${OUT:-runs/fast-gpu}
BUDGET_S=${BUDGET_S:-470}
STAGES=${STAGES:-"tests xl-fast xl-fast-inbwd xl-fast-eager xl-hf xl-compile xl-sdpa sizes-fast sizes-sdpa sizes-hf long-fast long-fast-sdpa long-sdpa long-hf kernels kernels-inbwd xl-naive sizes-naive long-compile compile-sizes"}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,memory.total --format=csv | tee -a "$LOG"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$LOG"
python3 -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -1 | tee -a "$LOG"
deadline=$((SECONDS + BUDGET_S))

# Estimated seconds per stage on an H100 (model build, warm-up, steps; torch.compile dominates).
# xl-fast includes compiling the Triton kernels on a fresh machine (no disk cache): ~30 s more.
ORDER=(tests xl-fast xl-fast-inbwd xl-fast-eager xl-hf xl-compile xl-sdpa sizes-fast sizes-sdpa sizes-hf long-fast
       long-fast-sdpa long-sdpa long-hf kernels kernels-inbwd xl-naive sizes-naive long-compile compile-sizes)
declare -A COST=([tests]=200 [xl-fast]=60 [xl-fast-inbwd]=35 [xl-fast-eager]=30 [xl-hf]=40 [xl-compile]=200 [xl-sdpa]=20
                 [sizes-fast]=110 [sizes-sdpa]=25 [sizes-hf]=30 [long-fast]=35 [long-fast-sdpa]=35 [long-sdpa]=15
                 [long-hf]=20 [kernels]=25 [kernels-inbwd]=25
                 [xl-naive]=15 [sizes-naive]=25 [long-compile]=120 [compile-sizes]=300)

STAGE_LOG=$LOG
# shellcheck source=../stages.sh
source "$(dirname "$0")/../stages.sh"

bench() {  # bench NAME ARGS...: lmscope bench ARGS within the stage's limit
  local name=$1
  shift
  run_stage "$name" python3 -m lmscope bench "$@" --resume --device cuda
}

STEP=(--context-length 512 --batch-size 4 --precision bf16 --mode train-step --warmup 3 --steps 10
      --out "$OUT/bench.jsonl")
LONG=(--size large --context-length 8192,16384 --batch-size 1 --precision bf16 --mode train-step
      --warmup 3 --steps 5 --out "$OUT/long.jsonl")
SIZES=small,medium,large,2.7B
COMPILE_SIZES=${COMPILE_SIZES:-$SIZES}

left=$(stage_limit tests)
if ((left > 0)); then
  left=$((left < 240 ? left : 240))
  echo "== tests (at most $left s)" | tee -a "$LOG"
  # the gpu-marked tests (real sizes), then every test of FusedAdamW and master_linear, which
  # run on the GPU as they are (none is marked: their CUDA paths are the side streams)
  timeout -s INT -k 10 "$left" bash -c '
    python3 -m pytest -m gpu -q -p no:cacheprovider \
      tests/kernels/test_rmsnorm.py tests/kernels/test_swiglu.py tests/kernels/test_rope_kernel.py \
      tests/kernels/test_fused_cross_entropy.py tests/kernels/test_flash_attention_triton.py \
      tests/model/test_fast_transformer.py tests/workloads/test_cuda_graph_step.py
    python3 -m pytest -q -p no:cacheprovider tests/kernels/test_adamw.py tests/model/test_master_linear.py
  ' > "$OUT/pytest_gpu.txt" 2>&1
  grep -E "passed|failed|error" "$OUT/pytest_gpu.txt" | tail -n 2 | tee -a "$LOG"
fi

bench xl-fast --size xl "${STEP[@]}" --attention flash --fast on --timeout 150
bench xl-fast-inbwd --size xl "${STEP[@]}" --attention flash --fast on --optimizer-in-backward on --timeout 150
bench xl-fast-eager --size xl "${STEP[@]}" --attention flash --fast on --cuda-graph off --timeout 120
bench xl-hf --size xl "${STEP[@]}" --attention sdpa --peer hf --timeout 150
bench xl-compile --size xl "${STEP[@]}" --attention sdpa --compile on --timeout 240
bench xl-sdpa --size xl "${STEP[@]}" --attention sdpa --timeout 120
bench sizes-fast --size "$SIZES" "${STEP[@]}" --attention flash --fast on --optimizer-in-backward off,on \
  --reuse-worker --timeout 150
bench sizes-sdpa --size "$SIZES" "${STEP[@]}" --attention sdpa --reuse-worker --timeout 120
bench sizes-hf --size "$SIZES" "${STEP[@]}" --attention sdpa --peer hf --reuse-worker --timeout 150
bench long-fast "${LONG[@]}" --attention flash --fast on --optimizer-in-backward off,on --reuse-worker \
  --timeout 150
bench long-fast-sdpa "${LONG[@]}" --attention sdpa --fast on --optimizer-in-backward off,on --reuse-worker \
  --timeout 150
bench long-sdpa "${LONG[@]}" --attention sdpa --reuse-worker --timeout 150
bench long-hf "${LONG[@]}" --attention sdpa --peer hf --reuse-worker --timeout 150

profile() {  # profile NAME FILE ARGS...: lmscope profile of the fast xl step within the stage's limit
  local name=$1 file=$2 left
  shift 2
  left=$(stage_limit "$name")
  ((left > 0)) || return 0
  echo "== $name (at most $left s)" | tee -a "$LOG"
  timeout -s INT -k 10 "$left" python3 -m lmscope profile --size xl --context-length 512 --batch-size 4 \
    --precision bf16 --mode train-step --attention flash --fast on --warmup 3 --steps 3 --device cuda \
    "$@" > "$OUT/$file" 2>&1
  tail -n 40 "$OUT/$file" >> "$LOG"
}

profile kernels kernels.md --out "$OUT/profile/profile.jsonl"
profile kernels-inbwd kernels_inbwd.md --optimizer-in-backward on --out "$OUT/profile_inbwd/profile.jsonl"

bench xl-naive --size xl "${STEP[@]}" --attention naive --timeout 120
bench sizes-naive --size "$SIZES" "${STEP[@]}" --attention naive --reuse-worker --timeout 120
bench long-compile "${LONG[@]}" --attention sdpa --compile on --timeout 200
bench compile-sizes --size "$COMPILE_SIZES" "${STEP[@]}" --attention sdpa --compile on --timeout 200

python3 benchmarks/fast/summarize.py "$OUT" > "$OUT/summary.md" 2>> "$LOG"
cat "$OUT/summary.md"
