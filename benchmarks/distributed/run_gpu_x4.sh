#!/usr/bin/env bash
# Collective bandwidth on 2 and 4 GPUs (nvidia-h200-x4), from the repo root:
#   OUT=/some/dir bash benchmarks/distributed/run_gpu_x4.sh
# all-reduce at 1 MB, 10 MB, 100 MB, 1 GB on 2 and 4 ranks, then the other collectives if time
# is left. Writes into $OUT: log.txt, comm.jsonl, comm.md, comm.busbw.png.
set -uo pipefail
OUT=${OUT:-runs/gpu-x4}
mkdir -p "$OUT"
export PYTHONPATH=src
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # no NVLink multicast
LM=(python3 -m lmscope)
SIZES=1MB,10MB,100MB,1GB
main() {
# (the body is not indented so that it reads as a plain script)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"

echo "== all-reduce, 2 and 4 ranks ($SECONDS s)"
timeout -k 15 -s INT 240 "${LM[@]}" comm --op all-reduce --size "$SIZES" --nproc 2,4 \
  --timeout 80 --out "$OUT/comm.jsonl" --format md

echo "== all collectives, 2 and 4 ranks ($SECONDS s)"
if (( SECONDS < 380 )); then
  timeout -k 15 -s INT $(( 460 - SECONDS )) "${LM[@]}" comm --op all --size "$SIZES" --nproc 2,4 \
    --timeout 80 --out "$OUT/comm.jsonl" --format md --resume
fi
cat "$OUT/comm.md"
echo "done in $SECONDS s"
}

main 2>&1 | tee "$OUT/log.txt"
