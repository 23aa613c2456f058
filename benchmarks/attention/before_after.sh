#!/usr/bin/env bash
# Issue 19's before/after in one GPU session: the same measurements with the lmscope source tree of
# an earlier commit (BEFORE, e.g. `git archive <commit> src | tar -x -C runs/before`, carried to the
# GPU machine) and with this checkout's src, in the order after, before, after again:
#   fast   the fast training step (CUDA graphs, flash attention) of xl (head dim 64) and 2.7B
#          (head dim 80) at context 512, batch 4, bf16 (SIZES: other presets, e.g. small,...,2.7B;
#          FAST_S: each pass's limit, default 130 s)
#   host   host microseconds per eager fwd+bwd, ours and SDPA's (host_public.py), at xl's layer
#   small  `lmscope attention` fwd+bwd at the short shapes of issue 19 (8x1024 d64, xl, 2.7B),
#          ours with SDPA flash and cuDNN
# Rows declare LMSCOPE_GIT_SHA (after) or BEFORE_SHA (before). PARTS picks some of the three
# (default "fast host small"). Usage (repo root, GPU machine):
#   OUT=/dir LMSCOPE_GIT_SHA=<after> BEFORE_SHA=<before> [BEFORE=runs/before/src] [PARTS=fast]
#   bash benchmarks/attention/before_after.sh
set -u
W=${OUT:?}/w
BEFORE=${BEFORE:-runs/before/src}
mkdir -p "$W"
export PYTHONUNBUFFERED=1
exec > >(tee -a "$W/log.txt") 2>&1
AFTER_SHA=${LMSCOPE_GIT_SHA:?}
for v in after before after2; do
  P=src; export LMSCOPE_GIT_SHA=$AFTER_SHA
  if [[ $v == before ]]; then P=$BEFORE; export LMSCOPE_GIT_SHA=${BEFORE_SHA:?}; fi
  export PYTHONPATH=$P:gpu_deps
  echo "== $v ($LMSCOPE_GIT_SHA, $SECONDS s elapsed)"
  part() { [[ " ${PARTS:-fast host small} " == *" $1 "* ]]; }
  part fast && timeout -s INT "${FAST_S:-130}" python3 -m lmscope bench --size "${SIZES:-xl,2.7B}" --context-length 512 --batch-size 4 \
    --precision bf16 --mode train-step --attention flash --fast on --reuse-worker --warmup 3 --steps 10 \
    --device cuda --out "$W/fast_$v.jsonl" | tail -4
  part host && timeout -s INT 60 python3 benchmarks/attention/host_public.py --shape 4,25,512,64 --out "$W/host_$v.jsonl"
  part small && for shape in "8 16 1024 64" "4 25 512 64" "4 32 512 80"; do
    set -- $shape
    timeout -s INT 60 python3 -m lmscope attention --impl flash-triton,sdpa-flash,sdpa-cudnn --dtype bf16 \
      --causal on --check-max-seq 2048 --reuse-worker --no-plot --timeout 60 --passes fwd,bwd,fwd_bwd \
      --batch "$1" --heads "$2" --seq-len "$3" --head-dim "$4" --out "$W/small_$v.jsonl" | tail -4
  done
done
echo "== done in $SECONDS s"
tar -czf "$OUT/before_after.tgz" -C "$W" .
