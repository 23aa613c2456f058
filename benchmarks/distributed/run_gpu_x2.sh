#!/usr/bin/env bash
# Distributed benchmarks on 2 GPUs (nvidia-h200-x2), from the repo root:
#   OUT=/some/dir bash benchmarks/distributed/run_gpu_x2.sh
# Stages, in this order, each run only if named in STAGES (comma-separated; default: all) and
# only while the time budget (BUDGET seconds, default 460) lasts:
#   tests   GPU tests of the distributed code paths (NCCL wrappers, sharded fused AdamW, comm, ddp);
#   ddp     the xl train step (context 512, bf16, batch 4 per rank: the study's batch, which by
#           estimate fits one H200 with AdamW state, naive attention and bucket buffers) with the
#           unsharded optimizer, per world size in DDP_NPROC, points in priority order: the
#           single-GPU baseline, then DDP_STRATEGIES (default bucketed:250/500/1000, overlap,
#           torch-ddp (PyTorch's default 25 MiB buckets), torch-ddp:500, coalesced:250/500/1000,
#           then the slow ones, naive and flat); points the budget cuts off are missing;
#   drift   the single-GPU baseline again, at the end, into ddp.single-end.jsonl (GPU clocks and
#           temperature drift over a run: compare its step_ms with the first baseline's);
#   sharded overlap and the fastest bucketed/coalesced/overlap strategy with the sharded optimizer;
#   comm    all-reduce at 1 MB, 10 MB, 100 MB, 1 GB at each world size in COMM_NPROC, then the
#           other collectives.
# COMM_NPROC and DDP_NPROC are lists (default 2), e.g. COMM_NPROC=2,4,8 DDP_NPROC=2,8 on an
# 8-GPU host. DDP_STEPS / DDP_WARMUP set the timed and untimed steps per ddp point (20 / 5);
# DDP_BATCH the batch per rank (default 4, the study's; larger batches move the eager xl step from
# the host toward the GPU).
# Writes into $OUT: log.txt, ddp.jsonl, ddp.md, ddp.summary.md, ddp.single-end.jsonl,
# comm.jsonl, comm.md, comm.busbw.png.
set -uo pipefail
OUT=${OUT:-runs/gpu-x2}
mkdir -p "$OUT"
export PYTHONPATH=src
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
LM=(python3 -m lmscope)
SIZES=1MB,10MB,100MB,1GB
STAGES=${STAGES:-tests,ddp,drift,sharded,comm}
BUDGET=${BUDGET:-460}
COMM_NPROC=${COMM_NPROC:-2}
DDP_NPROC=${DDP_NPROC:-2}
DDP_STRATEGIES=${DDP_STRATEGIES:-bucketed:250,bucketed:500,bucketed:1000,overlap,torch-ddp,torch-ddp:500,coalesced:250,coalesced:500,coalesced:1000,naive,flat}
XL=(--size xl --context-length 512 --batch-size "${DDP_BATCH:-4}" --precision bf16
    --warmup "${DDP_WARMUP:-5}" --steps "${DDP_STEPS:-20}" --timeout 150)

stage() { [[ ",$STAGES," == *",$1,"* ]]; }
left() { echo $(( BUDGET - SECONDS )); }
# run a command under the time left (minus a margin for the summary), if at least $1 s are left
within() {
  local need=$1; shift
  local limit=$(( BUDGET - SECONDS - 10 ))
  if (( limit < need )); then echo "(skipped: $(left) s left of $BUDGET)"; return 0; fi
  timeout -k 15 -s INT "$limit" "$@"
}

main() {
# (the body is not indented so that it reads as a plain script)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"
echo "stages: $STAGES; budget $BUDGET s; DDP_NPROC=$DDP_NPROC COMM_NPROC=$COMM_NPROC"

if stage tests; then
echo "== tests: gpu tests ($SECONDS s)"
within 60 timeout -k 15 -s INT 150 python3 -m pytest -q -m gpu tests/parallel -p no:cacheprovider 2>&1 | tail -15
fi

if stage ddp; then
IFS=, read -ra WORLDS <<< "$DDP_NPROC"
for world in "${WORLDS[@]}"; do
  echo "== ddp: xl, $world ranks, unsharded optimizer, with the single-GPU baseline ($SECONDS s)"
  # the points run in the order given (the baseline first), each row written when it finishes:
  # the budget cuts off the last strategies, and a cut sweep's rows are summarized at the end
  within 60 "${LM[@]}" ddp "${XL[@]}" --nproc "$world" --shard-optimizer off --strategy "$DDP_STRATEGIES" \
    --out "$OUT/ddp.jsonl" --resume --format md
done
fi

if stage drift; then
echo "== drift: the single-GPU baseline again ($SECONDS s)"
within 30 "${LM[@]}" ddp "${XL[@]}" --nproc 1 --strategy single --out "$OUT/ddp.single-end.jsonl"
fi

if stage sharded; then
BEST=$(python3 - "$OUT/ddp.jsonl" <<'PY'
import json, sys
from pathlib import Path
path = Path(sys.argv[1])
rows = [json.loads(line) for line in path.open() if line.strip()] if path.exists() else []
ok = [r for r in rows if r.get("status") == "ok" and not r["shard_optimizer"] and r["world_size"] == 2
      and (r["strategy"] == "overlap" or r["strategy"].startswith(("bucketed:", "coalesced:")))]
print(min(ok, key=lambda r: r["step_ms"])["strategy"] if ok else "bucketed:500")
PY
)
echo "== sharded: overlap and $BEST with the sharded optimizer, 2 ranks ($SECONDS s)"
within 60 "${LM[@]}" ddp "${XL[@]}" --nproc 2 --shard-optimizer on --strategy "overlap,$BEST" \
  --out "$OUT/ddp.jsonl" --resume
fi

if stage comm; then
echo "== comm: all-reduce, $COMM_NPROC ranks ($SECONDS s)"
within 60 "${LM[@]}" comm --op all-reduce --size "$SIZES" --nproc "$COMM_NPROC" \
  --timeout 80 --out "$OUT/comm.jsonl" --format md --resume
echo "== comm: other collectives, $COMM_NPROC ranks ($SECONDS s)"
within 60 "${LM[@]}" comm --op all --size "$SIZES" --nproc "$COMM_NPROC" \
  --timeout 80 --out "$OUT/comm.jsonl" --format md --resume
fi

echo "== summary ($SECONDS s)"
python3 - "$OUT" <<'PY'
import sys
from pathlib import Path
from lmscope.report.ddp_tables import ddp_summary, overhead_model_line
from lmscope.report.tables import build_table, render
from lmscope.records.results import read_records
from lmscope.running.runner import spec_fields
out = Path(sys.argv[1])
if (out / "ddp.jsonl").exists():
    rows = [r for r in read_records(out / "ddp.jsonl") if r.get("workload") == "ddp"]
    (out / "ddp.md").write_text(render(build_table(rows, spec_fields("ddp")), "md"))
    summary = render(ddp_summary(rows), "md") + "\n" + (overhead_model_line(rows) or "") + "\n"
    if (out / "ddp.single-end.jsonl").exists():
        first = [r["step_ms"] for r in rows if r.get("strategy") == "single" and r.get("status") == "ok"]
        end = [r["step_ms"] for r in read_records(out / "ddp.single-end.jsonl") if r.get("status") == "ok"]
        if first and end:
            summary += (f"\nsingle-GPU baseline: {first[0]:.1f} ms/step first, {end[-1]:.1f} ms/step at the end "
                        f"({100 * (end[-1] - first[0]) / first[0]:+.1f} %)\n")
    (out / "ddp.summary.md").write_text(summary)
    print(summary)
if (out / "comm.md").exists():
    print((out / "comm.md").read_text())
PY
echo "done in $SECONDS s"
}

main 2>&1 | tee "$OUT/log.txt"
