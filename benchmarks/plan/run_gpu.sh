#!/usr/bin/env bash
# GPU checks of issue 7 on one H100 (~3 min): CUDA autocast dtypes, accumulation on the GPU, and
# `plan flops` MFU from a measured `bench` step (it must equal bench's own MFU: same accounting).
# Usage (repo root, on the GPU machine, no uv): OUT=/some/dir bash benchmarks/plan/run_gpu.sh
set -u
OUT=${OUT:-runs/gpu-plan}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "device: $DEVICE"

python3 -m pytest -m gpu tests/planning/test_precision.py -q -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/gpu_tests.txt"
python3 -m lmscope precision autocast --model toy,small --dtype fp16,bf16 --device cuda --format md \
  > "$OUT/autocast_cuda.md"
python3 -m lmscope precision autocast --model toy,small --dtype fp16,bf16 --device cuda --format json \
  > "$OUT/autocast_cuda.json"
python3 -m lmscope precision accumulate --count 1000,10000 --device cuda --format json \
  > "$OUT/accumulate_cuda.json"
timeout 420 python3 -m lmscope bench --size small --context-length 512 --batch-size 4 --precision bf16 \
  --mode train-step --warmup 5 --steps 20 --timeout 300 --out "$OUT/bench.jsonl" > /dev/null
STEP_MS=$(python3 -c '
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
ok = [r for r in rows if r.get("status") == "ok"]
print(ok[-1]["median_ms"] if ok else "")' "$OUT/bench.jsonl" 2>/dev/null)
if [ -n "$STEP_MS" ]; then
  python3 -m lmscope plan flops --model small --batch-size 4 --context-length 512 --mode train-step \
    --step-ms "$STEP_MS" --device-name "$DEVICE" --precision bf16 --format json > "$OUT/plan_flops_mfu.json"
fi

python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
autocast = json.loads((out / "autocast_cuda.json").read_text())["sections"]
for title, rows in autocast.items():
    if title.startswith("toy"):
        got = {r["name"]: r["dtype"] for r in rows if r["kind"] in ("output", "loss")}
        print(f"{title:32s} fc1={got['fc1']} ln={got['ln']} fc2={got['fc2']} loss={got['cross_entropy']}")
acc = json.loads((out / "accumulate_cuda.json").read_text())["sections"]["accumulation"]
for r in acc:
    if r["count"] == 1000:
        print(f"accumulate 1000 x 0.01  acc={r['accumulator']} add={r['addend']} {r['cast']:8s} -> {r['result']!r}")
bench = [json.loads(l) for l in (out / "bench.jsonl").read_text().splitlines() if l.strip()]
plan = out / "plan_flops_mfu.json"
if bench and plan.exists():
    b = bench[-1]
    p = json.loads(plan.read_text())["sections"]["mfu"][0]
    print(f"bench small/512/bf16: median {b.get('median_ms'):.2f} ms  bench mfu {b.get('mfu')}  "
          f"plan mfu {p['mfu']}  plan TFLOP/s {p['achieved_tflops']:.1f}  peak {p['peak_tflops']}")
else:
    print("bench point did not finish:", bench[-1].get("status") if bench else "no rows")
PY
