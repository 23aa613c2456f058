#!/usr/bin/env bash
# The xl train step (bf16, batch 4, context 512) of lmscope's fast path and its peers, interleaved:
# ROUNDS rounds, each running fast (optimizer separate and inside the backward), HF's Llama,
# torch.compile (sdpa) and eager sdpa in turn, each point in a fresh process, so drift of clocks,
# temperature or host load hits them all alike. The models cannot share one sweep, so each is its
# own `lmscope bench --rounds R --round r` call into one results file; summarize.py pools the
# rounds' per-step times and prints every ratio with its 95 % bootstrap interval.
# Usage (repo root, GPU machine, no uv): OUT=/some/dir [ROUNDS=3] [STEPS=30] [COMPILE=on]
#   bash benchmarks/fast/run_interleaved.sh
# torch.compile costs about two minutes per round at xl (outside the timed steps); COMPILE=off
# leaves that peer out. Rerunning with the same OUT resumes (finished rounds are kept).
set -u
OUT=${OUT:-runs/fast-interleaved}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-30}
COMPILE=${COMPILE:-on}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
COMMON=(--size xl --context-length 512 --batch-size 4 --precision bf16 --mode train-step --warmup 3
        --steps "$STEPS" --device cuda --rounds "$ROUNDS" --out "$OUT/bench.jsonl" --resume)
for ((r = 0; r < ROUNDS; r++)); do
  python3 -m lmscope bench "${COMMON[@]}" --round "$r" --attention flash --fast on \
    --optimizer-in-backward off,on 2>&1 | tee -a "$LOG"
  python3 -m lmscope bench "${COMMON[@]}" --round "$r" --attention sdpa --peer hf 2>&1 | tee -a "$LOG"
  if [ "$COMPILE" = on ]; then
    python3 -m lmscope bench "${COMMON[@]}" --round "$r" --attention sdpa --compile on 2>&1 | tee -a "$LOG"
  fi
  python3 -m lmscope bench "${COMMON[@]}" --round "$r" --attention sdpa 2>&1 | tee -a "$LOG"
done
python3 benchmarks/fast/summarize.py "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
