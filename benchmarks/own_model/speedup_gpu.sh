#!/usr/bin/env bash
# Issue 38 on one H100: transformers' Llama-family models (random weights, bf16 autocast, train
# step, fused AdamW) in four setups of the same model, interleaved round by round:
#   eager    transformers' SDPA attention, the logits' fp32 cross-entropy, torch's fused AdamW
#   compile  the same under torch.compile (--compile $COMPILE, each decoder layer compiled once
#            with COMPILE_SCOPE=blocks; compile_s is its compile time)
#   liger    Liger-Kernel's apply_liger_kernel_to_<model_type>(model=...) (RMSNorm, SwiGLU, RoPE,
#            fused linear cross-entropy), SDPA attention (--peer liger)
#   fast     lmscope's fused path (--fast on: lmscope.model.hf_fast, FusedAdamW, CUDA graphs) with
#            lmscope's Triton FlashAttention (FAST_ATTENTION, default flash); at context 8192 also
#            with torch's SDPA pinned to cuDNN (FAST_ATTENTION_LONG, default flash,sdpa-cudnn)
# on the models
#   Llama-3.2-1B shape   batch 4 x 2048 (examples/llama-3.2-1b-shape.json), ROUNDS_1B rounds
#   Qwen2-0.5B shape     batch 4 x 2048 (examples/qwen2-0.5b-shape.json)
#   Mistral-7B shape     8 of its 32 layers (all 32 do not fit 80 GB with fp32 AdamW), batch 4 x 2048
#   Llama-3.1-8B shape   8 of its 32 layers, batch 1 x 8192, every decoder layer checkpointed
# The setups cannot share one sweep, so each is its own `lmscope bench --rounds R --round r` call
# into one results file (the order of the setups flips every round). Every call stops at the
# budget's end (SIGINT: finished points are kept; rerunning with the same OUT resumes), so the
# whole script stays within BUDGET_S, models in the order of MODELS. Each point is a fresh
# process; on an H100 a compiled point takes 30-90 s (the first of a model the longest: compile
# time), a Liger or lmscope point 20-40 s the first time (Triton compiles), the others 15-25 s.
# All four models do not fit one 9-minute call: run MODELS="llama-1b qwen2" and
# MODELS="mistral llama-8b" as two calls into one OUT (or two, then concatenate their bench.jsonl
# and rerun speedup_summary.py); what a budget cut is resumed by the same call again.
# Liger-Kernel must be importable: carry liger_kernel-0.8.5-py3-none-any.whl (pure Python + Triton)
# in gpu_deps/ (or point LIGER_WHEEL at it); it is installed into $OUT/deps, never into the
# system's Python. Without it the liger rows are one-line errors and the rest still runs.
# Usage (repo root, GPU machine, no uv):
#   OUT=/some/dir MODELS="llama-1b qwen2" [BUDGET_S=510] [COMPILE=reduce-overhead] [COMPILE_SCOPE=blocks]
#   [ROUNDS_1B=3] [STEPS=8]
#   [FAST_ATTENTION=flash] [FAST_ATTENTION_LONG=flash,sdpa-cudnn] bash benchmarks/own_model/speedup_gpu.sh
# COMPILE defaults to reduce-overhead (CUDA graphs), the strongest torch.compile mode measured at
# xl (benchmarks/results/fast/26-strongest-peers-h200); COMPILE=on,reduce-overhead measures both.
# COMPILE=max-autotune-no-cudagraphs compiles for minutes per model: give it a budget of its own.
# COMPILE_SCOPE=blocks (the default; empty for the whole model) compiles one decoder layer for all
# of them, a fraction of the whole model's compile time. ROUNDS_1B=3: a ratio's interval
# resamples rounds and needs three per side (lmscope.records.stats), so the 1B shape, where the
# targets are, gets three; the other models one (their intervals resample one process's steps).
# Writes to $OUT: bench.jsonl, summary.md and speedup.png (benchmarks/own_model/speedup_summary.py),
# log.txt.
set -u
OUT=${OUT:-runs/own-model-speedup}
BUDGET_S=${BUDGET_S:-510}
MODELS=${MODELS:-"llama-1b qwen2 mistral llama-8b"}
COMPILE=${COMPILE:-reduce-overhead}
COMPILE_SCOPE=${COMPILE_SCOPE-blocks}
ROUNDS_1B=${ROUNDS_1B:-3}
STEPS=${STEPS:-8}
FAST_ATTENTION=${FAST_ATTENTION:-flash}
FAST_ATTENTION_LONG=${FAST_ATTENTION_LONG:-flash,sdpa-cudnn}
LIGER_WHEEL=${LIGER_WHEEL:-$(ls gpu_deps/liger_kernel-*.whl 2>/dev/null | head -1)}
mkdir -p "$OUT"
export PYTHONPATH=src:gpu_deps:$OUT/deps PYTHONUNBUFFERED=1
deadline=$((SECONDS + BUDGET_S))
exec > >(tee -a "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if ! python3 -c "import liger_kernel" 2>/dev/null && [[ -n "$LIGER_WHEEL" ]]; then
  python3 -m pip install --quiet --no-deps --no-index --target "$OUT/deps" "$LIGER_WHEEL"
fi
python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__,
"transformers", transformers.__version__)'
python3 -c 'import liger_kernel, importlib.metadata as m; print("liger-kernel", m.version("liger-kernel"))' 2>/dev/null \
  || echo "liger-kernel not importable: the liger rows will say so"

BENCH=(python3 -m lmscope bench --precision bf16 --mode train-step --warmup 3 --steps "$STEPS"
       --device cuda --timeout 240 --resume --out "$OUT/bench.jsonl")
declare -A SETUP=(
  [eager]="--attention sdpa"
  [compile]="--attention sdpa --compile $COMPILE${COMPILE_SCOPE:+ --compile-scope $COMPILE_SCOPE}"
  [liger]="--attention sdpa --peer liger"
  [fast]="--fast on"
)
LLAMA_1B=(--model hf:examples/llama-3.2-1b-shape.json --batch-size 4 --context-length 2048)
QWEN2=(--model hf:examples/qwen2-0.5b-shape.json --batch-size 4 --context-length 2048)
MISTRAL=(--model hf:examples/mistral-7b-shape.json --num-layers 8 --batch-size 4 --context-length 2048)
LLAMA_8B=(--model hf:examples/llama-3.1-8b-shape.json --num-layers 8 --batch-size 1 --context-length 8192
          --checkpoint block)

bench() {  # bench ROUNDS ROUND SETUP FAST_ATTENTION MODEL_ARGS...: one setup of one model, in budget
  local rounds=$1 round=$2 setup=$3 attention=()
  [[ $setup == fast ]] && attention=(--attention "$4")
  shift 4
  local left=$((deadline - SECONDS))
  if ((left < 20)); then
    echo "== $setup round $round: skipped, out of budget"
    return 0
  fi
  echo "== $setup round $round/$rounds: $* (at most $left s, $SECONDS s elapsed)"
  # shellcheck disable=SC2086  # SETUP holds several flags
  timeout -s INT -k 20 "$left" "${BENCH[@]}" --rounds "$rounds" --round "$round" ${SETUP[$setup]} \
    "${attention[@]}" "$@" | tail -n 3
}

model() {  # model ROUNDS FAST_ATTENTION MODEL_ARGS...: every setup, ROUNDS rounds, order flipped
  local rounds=$1 attention=$2
  shift 2
  for ((r = 0; r < rounds; r++)); do
    local order=(eager compile liger fast)
    ((r % 2)) && order=(fast liger compile eager)
    for setup in "${order[@]}"; do
      bench "$rounds" "$r" "$setup" "$attention" "$@"
    done
  done
}

for name in $MODELS; do
  case $name in
    llama-1b) model "$ROUNDS_1B" "$FAST_ATTENTION" "${LLAMA_1B[@]}" ;;
    qwen2) model 1 "$FAST_ATTENTION" "${QWEN2[@]}" ;;
    mistral) model 1 "$FAST_ATTENTION" "${MISTRAL[@]}" ;;
    llama-8b) model 1 "$FAST_ATTENTION_LONG" "${LLAMA_8B[@]}" ;;
    *) echo "== unknown model $name (MODELS takes llama-1b qwen2 mistral llama-8b)" ;;
  esac
done
python3 benchmarks/own_model/speedup_summary.py "$OUT"
echo "== done in $SECONDS s: $OUT"
