#!/usr/bin/env bash
# The GPU tests (`pytest -m gpu`) on a GPU machine, most wanted first, within a budget: the
# kernels of the FlashAttention package and FSDP's GPU tests, then the fast path's and the
# transformers models' fused path, then every other file with a gpu-marked test. One pytest
# process, files in that order, `-v` so that a run cut by the budget (SIGINT: pytest still
# prints its summary) shows each test that ran. Writes $OUT/pytest.log.
# Usage (repo root, GPU machine, no uv): OUT=/some/dir [BUDGET_S=575] [FILES="tests/x.py ..."]
#   bash benchmarks/gpu_tests.sh
set -u
OUT=${OUT:-runs/gpu-tests}
BUDGET_S=${BUDGET_S:-575}
mkdir -p "$OUT"
export PYTHONPATH=src PYTHONUNBUFFERED=1
FIRST="tests/parallel/test_parallel_fsdp_gpu.py tests/kernels/test_flash_attention_triton.py
 tests/kernels/test_flash_native.py tests/kernels/test_flash_sm90.py tests/model/test_fast_transformer.py
 tests/model/test_hf_fast.py tests/sources/test_hf_speedups.py"
if [[ -z ${FILES:-} ]]; then
  FILES=$FIRST
  for file in $(grep -l "mark.gpu" -r tests --include='test_*.py' | sort); do
    [[ " $(echo $FIRST) " == *" $file "* ]] || FILES="$FILES $file"
  done
fi
{
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader || true
  # shellcheck disable=SC2086  # FILES is a list of paths
  timeout -s INT -k 10 "$BUDGET_S" python3 -m pytest -v -p no:cacheprovider -m gpu $FILES
  echo "pytest exit code $?"
} > "$OUT/pytest.log" 2>&1
grep -E "FAILED|ERROR|passed|failed|exit code" "$OUT/pytest.log" | tail -20
