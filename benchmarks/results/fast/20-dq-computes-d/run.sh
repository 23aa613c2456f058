# same-run comparison: FlashAttention backward with D in the dQ kernel (new) vs the preprocess kernel (old)
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
rm -rf /tmp/oldsrc; cp -r src /tmp/oldsrc; cp runs/old_flash/flash_attention.py /tmp/oldsrc/lmscope/kernels/
PYTHONPATH=src timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_flash_attention_triton.py \
  tests/model/test_fast_transformer.py > $R/pytest_gpu.txt 2>&1
tail -2 $R/pytest_gpu.txt
for v in new old new2; do
  P=src; G=d372a98d2096
  if [ $v = old ]; then P=/tmp/oldsrc; G=d372a98d2096-old-flash-bwd; fi
  export LMSCOPE_GIT_SHA=$G
  PYTHONPATH=$P timeout 120 python3 -m lmscope bench --size xl --context-length 512 --batch-size 4 --precision bf16 \
    --mode train-step --attention flash --fast on --optimizer-in-backward off,on --reuse-worker --warmup 3 --steps 10 \
    --device cuda --out $R/bench_$v.jsonl > $R/bench_$v.txt 2>&1
  PYTHONPATH=$P timeout 150 python3 -m lmscope bench --size large --context-length 8192,16384 --batch-size 1 \
    --precision bf16 --mode train-step --attention flash --fast on --optimizer-in-backward on --reuse-worker --warmup 3 \
    --steps 5 --device cuda --out $R/long_$v.jsonl > $R/long_$v.txt 2>&1
  PYTHONPATH=$P timeout 90 python3 -m lmscope attention --preset leaderboard --impl flash-triton --device cuda \
    --out $R/attention_$v.jsonl > $R/attention_$v.txt 2>&1
done
for f in $R/bench_*.jsonl $R/long_*.jsonl $R/attention_*.jsonl; do
  python3 -c "
import json,sys
for l in open(sys.argv[1]):
    r=json.loads(l); print(sys.argv[1].split('/')[-1], r.get('size'), r.get('context_length') or r.get('seq_len'), r.get('optimizer_in_backward'), r['status'], r.get('median_ms') or r.get('fwd_bwd_ms'), r.get('bwd_ms'))
" $f
done
