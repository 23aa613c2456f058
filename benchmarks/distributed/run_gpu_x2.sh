#!/usr/bin/env bash
# Distributed benchmarks on 2 GPUs (nvidia-h200-x2), from the repo root:
#   OUT=/some/dir bash benchmarks/distributed/run_gpu_x2.sh
# On a 4-GPU host, COMM_NPROC=2,4 runs the collectives at 2 and 4 ranks in the same call (the
# ddp sweep always uses 2 ranks, GPUs 0 and 1).
# 1. GPU tests of the distributed code paths (NCCL wrappers, sharded fused AdamW, comm, ddp);
# 2. all-reduce at 1 MB, 10 MB, 100 MB, 1 GB on 2 ranks;
# 3. the xl train step (context 512, bf16, batch 4 per rank: the study's batch, which by
#    estimate fits one H200 with AdamW state, naive attention and DDP's bucket buffers) per
#    strategy with the unsharded optimizer, plus the single-GPU baseline;
# 4. overlap and the fastest bucketed/overlap strategy again with the sharded optimizer;
# 5. all-gather, reduce-scatter and broadcast if time is left.
# Writes into $OUT: log.txt, comm.jsonl, comm.md, comm.busbw.png, ddp.jsonl, ddp.md, ddp.summary.md.
set -uo pipefail
OUT=${OUT:-runs/gpu-x2}
mkdir -p "$OUT"
export PYTHONPATH=src
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
LM=(python3 -m lmscope)
SIZES=1MB,10MB,100MB,1GB
COMM_NPROC=${COMM_NPROC:-2}
XL=(--size xl --context-length 512 --batch-size 4 --precision bf16 --nproc 2 --warmup 3 --steps 10)
main() {
# (the body is not indented so that it reads as a plain script)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"

echo "== 1. gpu tests ($SECONDS s)"
timeout -k 15 -s INT 120 python3 -m pytest -q -m gpu tests/parallel -p no:cacheprovider 2>&1 | tail -15

echo "== 2. all-reduce, $COMM_NPROC ranks ($SECONDS s)"
timeout -k 15 -s INT 150 "${LM[@]}" comm --op all-reduce --size "$SIZES" --nproc "$COMM_NPROC" \
  --timeout 80 --out "$OUT/comm.jsonl" --format md

echo "== 3. xl ddp strategies, unsharded optimizer, and the single-GPU baseline ($SECONDS s)"
timeout -k 15 -s INT 230 "${LM[@]}" ddp "${XL[@]}" --timeout 150 --shard-optimizer off \
  --strategy naive,flat,overlap,bucketed:1,bucketed:10,bucketed:100,bucketed:1000,torch-ddp \
  --out "$OUT/ddp.jsonl" --format md

BEST=$(python3 - "$OUT/ddp.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
ok = [r for r in rows if r.get("status") == "ok" and not r["shard_optimizer"]
      and (r["strategy"] == "overlap" or r["strategy"].startswith("bucketed:"))]
print(min(ok, key=lambda r: r["step_ms"])["strategy"] if ok else "bucketed:100")
PY
)
echo "== 4. overlap and $BEST with the sharded optimizer ($SECONDS s)"
if (( SECONDS < 380 )); then
  timeout -k 15 -s INT $(( 460 - SECONDS )) "${LM[@]}" ddp "${XL[@]}" --timeout 150 \
    --shard-optimizer on --strategy "overlap,$BEST" --out "$OUT/ddp.jsonl" --resume
fi

echo "== 5. other collectives, $COMM_NPROC ranks ($SECONDS s)"
if (( SECONDS < 400 )); then
  timeout -k 15 -s INT $(( 460 - SECONDS )) "${LM[@]}" comm --op all --size "$SIZES" --nproc "$COMM_NPROC" \
    --timeout 80 --out "$OUT/comm.jsonl" --format md --resume
fi

echo "== summary ($SECONDS s)"
python3 - "$OUT" <<'PY'
import sys
from pathlib import Path
from lmscope.parallel.commands import ddp_summary, overhead_model_line
from lmscope.report.tables import build_table, render
from lmscope.results import read_records
from lmscope.runner import spec_fields
out = Path(sys.argv[1])
if (out / "ddp.jsonl").exists():
    rows = [r for r in read_records(out / "ddp.jsonl") if r.get("workload") == "ddp"]
    (out / "ddp.md").write_text(render(build_table(rows, spec_fields("ddp")), "md"))
    summary = render(ddp_summary(rows), "md") + "\n" + (overhead_model_line(rows) or "") + "\n"
    (out / "ddp.summary.md").write_text(summary)
    print(summary)
if (out / "comm.md").exists():
    print((out / "comm.md").read_text())
PY
echo "done in $SECONDS s"
}

main 2>&1 | tee "$OUT/log.txt"
