#!/usr/bin/env bash
# One H100 call that measures what the open issues need from a single GPU, each stage under its
# own time limit (a stage cut at its limit keeps its finished points; rerun a stage with STAGES=...
# and the same OUT to resume it). Usage (repo root, GPU machine, no uv):
#   OUT=/some/dir [STAGES="tests attention own activations interleaved"] bash benchmarks/h100_round.sh
# Stages and their limits (seconds); the default STAGES is the one above; later calls of a round
# name others, e.g. STAGES="tests-all fidelity own-more activations-more":
#   tests        75  the GPU tests of the code changed in this round (launch path, head dims 80/96,
#                    FLOP counter, NVML energy, saved activations, probe, provenance, sources)
#   attention   115  the leaderboard preset (every peer in one run), issue 19's six shapes (ours,
#                    SDPA flash, SDPA cuDNN; fwd+bwd), and the host-time breakdown at xl's layer
#                    (ATTENTION_S seconds: all six shapes need about 240); do_bench's rep is REP_MS
#                    (default 1000: at do_bench's 100 a 30 ms call is timed only a handful of times)
#   native      420  the C++ host path (lmscope.kernels.flash_native): its build, its GPU tests,
#                    host_native.py at xl's and 2.7B's layers, the short shapes with it on and off
#   host         40  the host-time breakdown alone (also part of attention), whole output in
#                    host_breakdown.txt
#   engine       40  the autograd engine's device thread against the calling thread, at xl's layer
#                    (benchmarks/attention/engine_thread.py)
#   own         125  transformers' GPT-2 (124M) and a Llama-3.2-1B shape from config, and a module
#                    from a file: bench (eager, and compiled GPT-2), profile and memory rows; then the
#                    timing-fidelity check (lmscope vs a plain CUDA-event loop, interleaved)
#   activations  75  the checkpoint plan of xl-2025 measured beside no checkpointing, and saved
#                    activations per block of small..xl at context 512 against the formula
#   interleaved 170  the xl fast step and its peers (HF Llama, eager SDPA) in 2 interleaved rounds
#   tests-all   420  every GPU test of the changed code (only those whose name holds no "leaderboard"),
#                    whole output in pytest_gpu.txt; the FlashAttention file runs last and takes ~200 s
#   fidelity     40  the timing-fidelity check alone
#   own-more    300  issue 17's matrix (OWN_MORE_S seconds): the file module, GPT-2 and the Llama
#                    shape at 1024 and 4096 (bf16, fp32), compiled, profile and memory; it starts
#                    from the committed rows in benchmarks/results/own_model (--resume skips them)
#   activations-more 120  saved activations per block of small..2.7B at contexts 512 and 2048
#   dq-modes    300  the long-context shapes of issue 19 (16k d64, 8k and 32k d128, 8x1024 d64):
#                    ours in each dQ mode of DQ_MODES (default "separate atomic"; the "tma" mode
#                    it measured first is gone since), cuDNN beside each, fwd, bwd and fwd+bwd
#                    (DQ_MODES_S seconds, REP_MS as above; DQ_SHAPES: other shapes, "B H S d" comma
#                    separated); first the GPU tests of the atomic mode and of head
#                    dims 80, 96, 128
#   wide-small  200  the short shapes of issue 19 (8x1024 d64, xl, 2.7B): ours with the default and
#                    the wide config lists (LMSCOPE_FLASH_WIDE=1), cuDNN and SDPA flash beside each,
#                    fwd, bwd and fwd+bwd
# Writes the rows and log.txt to $OUT/w while it runs, then round.tgz (all of it, no traces) to
# $OUT (the device tool brings back at most 8 files). The energy fields need nvidia-ml-py: put
# pynvml.py in gpu_deps/ (a folder .git/info/exclude ignores) and carry it.
set -u
OUT=${OUT:-runs/h100-round}
STAGES=${STAGES:-"tests attention own activations interleaved"}
W="$OUT/w"
mkdir -p "$W"
export PYTHONPATH=src:gpu_deps PYTHONUNBUFFERED=1
exec > >(tee -a "$W/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
LM=(python3 -m lmscope)

stage() {  # stage NAME LIMIT_S: whether NAME is asked for; prints a header
  [[ " $STAGES " == *" $1 "* ]] || return 1
  echo "== $1 (limit $2 s, $SECONDS s elapsed)"
}
limit() { timeout -s INT -k 15 "$@"; }

if stage native 420; then  # the C++ host path: build, its tests, host time and short shapes on/off
  limit 150 python3 -c 'import time, torch; from lmscope.kernels import flash_native as n; t = time.time()
print("C++ host path built:", n.extension() is not None, f"in {time.time() - t:.0f} s")'
  limit 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_flash_native.py 2>&1 | tail -8
  limit 60 python3 benchmarks/attention/host_native.py --shape 4,25,512,64 --out "$W/host_native.jsonl"
  limit 90 python3 benchmarks/attention/host_native.py --shape 4,32,512,80 --out "$W/host_native.jsonl"
  N=(--impl flash-triton,sdpa-flash,sdpa-cudnn --dtype bf16 --causal on --check-max-seq 2048
     --reuse-worker --no-plot --timeout 120 --resume --passes fwd,bwd,fwd_bwd)
  for native in 1 0; do
    for shape in "8 16 1024 64" "4 25 512 64" "4 32 512 80"; do
      set -- $shape
      LMSCOPE_FLASH_NATIVE=$native limit 60 "${LM[@]}" attention "${N[@]}" --batch "$1" --heads "$2" \
        --seq-len "$3" --head-dim "$4" --out "$W/small_native$native.jsonl" | tail -4
    done
  done
fi
if stage tests 75; then
  limit 30 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_triton_launch.py \
    tests/kernels/test_flash_attention_triton.py -k "direct or hook or 80 or 96" 2>&1 | tail -6
  limit 45 python3 -m pytest -q -m gpu -p no:cacheprovider tests/measure/test_flop_count_gpu.py tests/measure/test_energy_gpu.py \
    tests/measure/test_saved_activations_gpu.py tests/test_probe_gpu.py tests/records/test_provenance.py \
    tests/sources/test_sources_gpu.py 2>&1 | tail -15
fi
if stage attention "${ATTENTION_S:-115}"; then
  A=(--impl flash-triton,sdpa-flash,sdpa-cudnn --dtype bf16 --causal on --check-max-seq 2048
     --reuse-worker --no-plot --timeout 120 --resume --rep-ms "${REP_MS:-1000}" --out "$W/attention_shapes.jsonl")
  deadline=$((SECONDS + ${ATTENTION_S:-115}))
  limit 30 "${LM[@]}" attention --preset leaderboard --compare impl --reuse-worker --timeout 120 \
    --resume --out "$W/leaderboard.jsonl"
  for shape in "1 16 16384 64" "1 16 8192 128" "1 16 32768 128" "8 16 1024 64" "4 25 512 64" "4 32 512 80"; do
    set -- $shape
    left=$((deadline - SECONDS - 40))
    ((left > 5)) && limit "$left" "${LM[@]}" attention "${A[@]}" --passes fwd_bwd --batch "$1" \
      --heads "$2" --seq-len "$3" --head-dim "$4" | tail -6
  done
fi
if [[ " $STAGES " == *" attention "* ]] || stage host 40; then  # its whole output, profiler table too
  limit 40 python3 benchmarks/attention/host_breakdown.py --shape 4,25,512,64 --out "$W/host.jsonl" \
    > "$W/host_breakdown.txt" 2>&1
  head -30 "$W/host_breakdown.txt"
fi
if stage engine 40; then
  limit 40 python3 benchmarks/attention/engine_thread.py --shape 4,25,512,64 --out "$W/engine_thread.jsonl"
fi
if stage dq-modes "${DQ_MODES_S:-300}"; then
  deadline=$((SECONDS + ${DQ_MODES_S:-300}))
  limit 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_flash_attention_triton.py \
    -k "atomic or 128 or 80 or 96" 2>&1 | tail -8
  D=(--impl flash-triton,sdpa-cudnn --dtype bf16 --causal on --check-max-seq 2048 --reuse-worker
     --no-plot --timeout 150 --resume --rep-ms "${REP_MS:-1000}" --passes fwd,bwd,fwd_bwd)
  IFS=, read -ra shapes <<< "${DQ_SHAPES:-1 16 16384 64,1 16 8192 128,8 16 1024 64,1 16 32768 128}"
  for shape in "${shapes[@]}"; do
    set -- $shape
    for mode in ${DQ_MODES:-separate atomic}; do
      left=$((deadline - SECONDS))
      ((left > 10)) && LMSCOPE_FLASH_DQ=$mode limit "$left" "${LM[@]}" attention "${D[@]}" --batch "$1" \
        --heads "$2" --seq-len "$3" --head-dim "$4" --out "$W/dq_$mode.jsonl" | tail -4
    done
  done
fi
if stage wide-small 200; then
  deadline=$((SECONDS + 200))
  D=(--impl flash-triton,sdpa-cudnn,sdpa-flash --dtype bf16 --causal on --check-max-seq 2048
     --reuse-worker --no-plot --timeout 120 --resume --passes fwd,bwd,fwd_bwd)
  for shape in "8 16 1024 64" "4 25 512 64" "4 32 512 80"; do
    set -- $shape
    for wide in "" 1; do
      left=$((deadline - SECONDS))
      ((left > 10)) && limit "$left" env ${wide:+LMSCOPE_FLASH_WIDE=1} "${LM[@]}" attention "${D[@]}" --batch "$1" \
        --heads "$2" --seq-len "$3" --head-dim "$4" --out "$W/small${wide:+_wide}.jsonl" | tail -4
    done
  done
fi
if stage own 125; then
  deadline=$((SECONDS + 125))
  GPT2=(--model hf:gpt2 --attention sdpa --context-length 1024 --batch-size 8 --precision bf16)
  LLAMA=(--model hf:examples/llama-3.2-1b-shape.json --attention sdpa --context-length 1024
         --batch-size 4 --precision bf16)
  OWN=(--model examples/own_lm.py:build --context-length 1024 --batch-size 8 --precision bf16)
  B=(bench --warmup 3 --steps 10 --timeout 120 --resume --out "$W/own_bench.jsonl")
  limit 60 "${LM[@]}" "${B[@]}" "${GPT2[@]}" --compile off,on | tail -8
  limit 20 "${LM[@]}" "${B[@]}" "${LLAMA[@]}" | tail -6
  limit 15 "${LM[@]}" "${B[@]}" "${OWN[@]}" | tail -6
  left=$((deadline - SECONDS - 30))
  ((left > 10)) && limit "$left" "${LM[@]}" memory "${GPT2[@]}" --snapshot off --warmup 1 --steps 2 \
    --timeout 60 --resume --out "$W/own_memory.jsonl" | tail -6
  left=$((deadline - SECONDS - 30))
  ((left > 10)) && limit "$left" "${LM[@]}" profile "${GPT2[@]}" --warmup 2 --steps 2 --timeout 60 \
    --resume --out "$W/own_profile.jsonl" | tail -6
  limit 30 python3 benchmarks/own_model/fidelity.py --rounds 4 --steps 10 --out "$W/fidelity.jsonl" \
    | tail -6
fi
if stage tests-all 420; then
  limit 420 python3 -m pytest -q -m gpu -rs -p no:cacheprovider tests/kernels/test_flash_native.py \
    tests/kernels/test_triton_launch.py tests/kernels/test_flash_attention_launch.py \
    tests/measure/test_flop_count_gpu.py tests/measure/test_energy_gpu.py tests/measure/test_memory_gpu.py \
    tests/measure/test_saved_activations_gpu.py tests/test_probe_gpu.py tests/records/test_provenance.py \
    tests/sources/test_sources_gpu.py tests/workloads/test_cuda_graph_step.py tests/model/test_fast_transformer.py \
    tests/workloads/test_attention_bench.py tests/kernels/test_flash_attention_triton.py \
    -k "not leaderboard" > "$W/pytest_gpu.txt" 2>&1
  tail -40 "$W/pytest_gpu.txt"
fi
if stage fidelity 40; then
  limit 40 python3 benchmarks/own_model/fidelity.py --rounds 4 --steps 10 --out "$W/fidelity.jsonl" | tail -4
fi
if stage own-more "${OWN_MORE_S:-300}"; then  # the rest of issue 17's matrix, most wanted first
  deadline=$((SECONDS + ${OWN_MORE_S:-300}))
  for kind in bench profile memory; do  # the committed rows: --resume skips what they hold
    [[ -f "$W/own_$kind.jsonl" ]] || cp "benchmarks/results/own_model/$kind.jsonl" "$W/own_$kind.jsonl"
  done
  GPT2=(--model hf:gpt2 --attention sdpa)
  LLAMA=(--model hf:examples/llama-3.2-1b-shape.json --attention sdpa)
  B=(bench --warmup 3 --steps 10 --timeout 180 --resume --reuse-worker --out "$W/own_bench.jsonl")
  P=(profile --warmup 2 --steps 2 --timeout 90 --resume --out "$W/own_profile.jsonl")
  M=(memory --warmup 1 --steps 2 --snapshot off --timeout 90 --resume --out "$W/own_memory.jsonl")
  while read -r need args; do
    left=$((deadline - SECONDS))
    ((left > need)) || { echo "-- skipped (time): $args"; continue; }
    limit "$left" "${LM[@]}" $args < /dev/null | tail -5
  done <<EOF2
20 ${B[*]} --model examples/own_lm.py:build --context-length 1024 --batch-size 8 --precision bf16
30 ${B[*]} ${GPT2[*]} --context-length 1024 --batch-size 8 --precision bf16,fp32
30 ${B[*]} ${GPT2[*]} --context-length 4096 --batch-size 2 --precision bf16,fp32
30 ${B[*]} ${LLAMA[*]} --context-length 1024 --batch-size 4 --precision bf16,fp32
40 ${B[*]} ${LLAMA[*]} --context-length 4096 --batch-size 1 --precision bf16,fp32
30 ${P[*]} ${GPT2[*]} --context-length 1024 --batch-size 8 --precision bf16
30 ${P[*]} ${LLAMA[*]} --context-length 1024 --batch-size 4 --precision bf16
30 ${M[*]} ${GPT2[*]} --context-length 1024 --batch-size 8 --precision bf16
30 ${M[*]} ${LLAMA[*]} --context-length 1024 --batch-size 4 --precision bf16
30 ${P[*]} ${GPT2[*]} --context-length 4096 --batch-size 2 --precision bf16
30 ${M[*]} ${GPT2[*]} --context-length 4096 --batch-size 2 --precision bf16
30 ${P[*]} ${LLAMA[*]} --context-length 4096 --batch-size 1 --precision bf16
30 ${M[*]} ${LLAMA[*]} --context-length 4096 --batch-size 1 --precision bf16
20 ${P[*]} --model examples/own_lm.py:build --context-length 1024 --batch-size 8 --precision bf16
20 ${M[*]} --model examples/own_lm.py:build --context-length 1024 --batch-size 8 --precision bf16
60 ${B[*]} ${GPT2[*]} --context-length 1024 --batch-size 8 --precision bf16 --compile on
90 ${B[*]} ${LLAMA[*]} --context-length 1024 --batch-size 4 --precision bf16 --compile on
60 ${B[*]} ${GPT2[*]} --context-length 4096 --batch-size 2 --precision bf16 --compile on
90 ${B[*]} ${LLAMA[*]} --context-length 4096 --batch-size 1 --precision bf16 --compile on
60 ${B[*]} ${GPT2[*]} --context-length 1024 --batch-size 8 --precision fp32 --compile on
60 ${B[*]} ${GPT2[*]} --context-length 4096 --batch-size 2 --precision fp32 --compile on
90 ${B[*]} ${LLAMA[*]} --context-length 1024 --batch-size 4 --precision fp32 --compile on
90 ${B[*]} ${LLAMA[*]} --context-length 4096 --batch-size 1 --precision fp32 --compile on
EOF2
fi
if stage activations-more 120; then
  limit 120 "${LM[@]}" memory --size 2.7B,small,medium,large,xl --context-length 512,2048 --batch-size 4 \
    --precision bf16 --mode forward-backward --attention sdpa --activations on --warmup 1 --steps 2 \
    --snapshot off --timeout 60 --resume --out "$W/activations.jsonl" | tail -14
fi
if stage activations 75; then
  XL=(--batch-size 4 --context-length 2048 --precision bf16 --attention sdpa --mode forward-backward)
  "${LM[@]}" plan checkpoint --model xl-2025 "${XL[@]}" --budget 40GiB --format json > "$W/plan_xl-2025.json"
  limit 35 "${LM[@]}" memory --size xl-2025 "${XL[@]}" --checkpoint "none;plan:40GiB" --warmup 2 \
    --steps 5 --snapshot off --timeout 60 --resume --out "$W/activations.jsonl" | tail -8
  limit 40 "${LM[@]}" memory --size small,medium,large,xl --context-length 512 --batch-size 4 \
    --precision bf16 --mode forward-backward --attention sdpa --activations on --warmup 1 --steps 2 \
    --snapshot off --timeout 60 --resume --out "$W/activations.jsonl" | tail -12
fi
if stage interleaved 170; then
  limit 170 env OUT="$W/interleaved" ROUNDS=2 STEPS=15 COMPILE=off bash benchmarks/fast/run_interleaved.sh \
    | tail -25
fi
echo "== done in $SECONDS s"
tar -czf "$OUT/round.tgz" --exclude='*.json.gz' --exclude='*.pickle' --exclude='*.png' -C "$W" .
