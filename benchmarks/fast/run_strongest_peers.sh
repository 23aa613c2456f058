#!/usr/bin/env bash
# Peers at their strongest (issue 34): lmscope's fast xl train step (bf16, batch 4, context 512)
# against eager SDPA, torch.compile of the eager model in its three modes (default,
# reduce-overhead with CUDA graphs, max-autotune-no-cudagraphs) and HF's Llama, eager and (HF_COMPILE=on,
# the default) under torch.compile in the same modes, each decoder layer compiled, in ROUNDS
# interleaved rounds: each model is its own `lmscope bench --rounds R --round r` call into one
# results file, every point a fresh process each round, so drift hits all alike. torch.compile
# compiles each block (`--compile-scope blocks`): a cold whole-model compile of xl takes minutes per
# mode, a block compiled once serves all 48. Every row also carries the GPU's busy share and the
# host-bound flag. summarize.py then pools the rounds and writes summary.md ("Peers at their
# strongest": each compile mode's compile_s, its ratio to the fast step with the 95 % interval,
# whole-step MFU).
# BUDGET_S bounds the whole script (a command gets what is left, SIGINT at that limit; finished
# points are kept and a rerun with the same OUT resumes the rest); POINT_S is each point's
# --timeout, so a compile that runs past it is a timeout row and the rounds go on.
# Usage (repo root, GPU machine, no uv): OUT=/some/dir [ROUNDS=2] [STEPS=15] [BUDGET_S=470]
#   [POINT_S=240] [WHOLE_MODEL=on] [HF=off] [HF_COMPILE=off] [FIRST_ROUND=0] bash benchmarks/fast/run_strongest_peers.sh
# (SIZE, DEVICE and COMPILE_MODES change the point for a dry run elsewhere, e.g. SIZE=tiny
# DEVICE=cpu COMPILE_MODES=on: the fast point is then an error row, it needs a GPU.)
set -u
OUT=${OUT:-runs/strongest-peers}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-15}
BUDGET_S=${BUDGET_S:-470}
POINT_S=${POINT_S:-240}
SIZE=${SIZE:-xl}
DEVICE=${DEVICE:-cuda}
COMPILE_MODES=${COMPILE_MODES:-on,reduce-overhead,max-autotune-no-cudagraphs}
FIRST_ROUND=${FIRST_ROUND:-0}  # a later round: add rounds to an OUT whose earlier rounds are done
HF=${HF:-on}  # off: no HF rows at all (a call that only adds a compile mode's rounds)
HF_COMPILE=${HF_COMPILE:-on}  # off: HF's Llama eager only
WHOLE_MODEL=${WHOLE_MODEL:-off}  # on: also torch.compile of the whole model, default mode, each round
SUMMARY_S=20  # kept for summarize.py at the end
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader || true
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
COMMON=(--size "$SIZE" --context-length 512 --batch-size 4 --precision bf16 --mode train-step --warmup 3
        --steps "$STEPS" --device "$DEVICE" --rounds "$ROUNDS" --out "$OUT/bench.jsonl" --resume
        --timeout "$POINT_S")

bench() {  # bench ROUND ARGS...: round ROUND of one model's points, within what is left of BUDGET_S
  local round=$1 left=$((BUDGET_S - SUMMARY_S - SECONDS))
  shift
  if ((left < 30)); then
    echo "== round $round: $* skipped, the budget is spent ($SECONDS s elapsed)"
    return
  fi
  echo "== round $round: $* ($SECONDS s elapsed, $left s left)"
  timeout -s INT -k 10 "$left" python3 -m lmscope bench "${COMMON[@]}" --round "$round" "$@"
}

for ((r = FIRST_ROUND; r < ROUNDS; r++)); do
  bench "$r" --attention flash --fast on
  bench "$r" --attention sdpa
  bench "$r" --attention sdpa --compile "$COMPILE_MODES" --compile-scope blocks
  if [ "$HF" = on ]; then
    bench "$r" --attention sdpa --peer hf
    if [ "$HF_COMPILE" = on ]; then
      bench "$r" --attention sdpa --peer hf --compile "$COMPILE_MODES" --compile-scope blocks
    fi
  fi
  if [ "$WHOLE_MODEL" = on ]; then  # the committed compile rows' scope: minutes of cold compile at xl
    bench "$r" --attention sdpa --compile on
  fi
done
echo "== summary ($SECONDS s elapsed)"
python3 benchmarks/fast/summarize.py "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
echo "== done in $SECONDS s"
