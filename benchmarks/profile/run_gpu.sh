#!/usr/bin/env bash
# lmscope profile on one GPU (H100): the large model at contexts 128..1024, forward and full train
# step, fp32 and bf16, naive attention (its scores/mask/softmax/output ranges feed the attention
# breakdown). 3 warm-up steps, then 3 unprofiled and 3 profiled steps per point; ~4-5 min.
#
# Run from the repository root:  OUT=/some/folder bash benchmarks/profile/run_gpu.sh
# Files written to $OUT (at most 8):
#   results.jsonl          one row per point (step_ms, profiled_step_ms, overhead_pct, *_frac, ...)
#   reports.md             the markdown reports of all points, one after another
#   kernels_all.csv        every kernel of every phase of every point (full names), with a point column
#   trace_<point>.json.gz  the Chrome/Perfetto trace of large, context 128, train step, fp32
#   sweep.txt              terminal output of the sweep
#   one_point_nsys.txt     terminal tables of one point and the nsys command that captures it
#   pytest_gpu.txt         the GPU tests of the kernel profiler
set -u

OUT=${OUT:-runs/profile-gpu}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/lmscope-profile.XXXXXX)
export PYTHONPATH=src PYTHONUNBUFFERED=1
LM="python3 -m lmscope"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# 1. The sweep: 4 contexts x 2 modes x 2 precisions = 16 points, each in its own process.
#    One reused worker process (each point warms up); stopped (finished points kept) after 6 min.
timeout -s INT 360 $LM profile --size large --context-length 128,256,512,1024 --mode forward,train-step \
    --precision fp32,bf16 --attention naive --warmup 3 --steps 3 --device cuda \
    --timeout 240 --out "$WORK/results.jsonl" --reuse-worker > "$OUT/sweep.txt" 2>&1
tail -n 30 "$OUT/sweep.txt"

# 2. One point again with --resume: nothing reruns; it prints that point's full tables and the
#    exact `nsys profile` command (nsys is not installed on these machines, so it is not run).
$LM profile --size large --context-length 128 --mode train-step --precision fp32 --attention naive \
    --warmup 3 --steps 3 --device cuda --out "$WORK/results.jsonl" --resume --nsys \
    > "$OUT/one_point_nsys.txt" 2>&1 || echo "one-point rerun failed (see one_point_nsys.txt)"

# 3. Gather the artifacts (folders below $WORK/profile/<point>/) into at most 8 files.
cp "$WORK/results.jsonl" "$OUT/results.jsonl"
python3 - "$WORK" "$OUT" <<'PY'
import csv, pathlib, shutil, sys
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
points = sorted(p for p in (work / "profile").iterdir() if (p / "report.md").exists())
with open(out / "reports.md", "w") as reports:
    for point in points:
        reports.write((point / "report.md").read_text() + "\n---\n\n")
with open(out / "kernels_all.csv", "w", newline="") as handle:
    writer = None
    for point in points:
        with open(point / "kernels.csv", newline="") as source:
            for row in csv.DictReader(source):
                if writer is None:
                    writer = csv.DictWriter(handle, ["point", *row])
                    writer.writeheader()
                writer.writerow({"point": point.name, **row})
traces = [p / "trace.json.gz" for p in points if p.name.startswith("large-ctx128-b4-train-step-fp32-")]
if traces:
    shutil.copy(traces[0], out / "trace_large-ctx128-train-step-fp32.json.gz")
print(f"gathered {len(points)} point reports")
PY

# 4. GPU tests of the profiler.
python3 -m pytest -q -m gpu tests/measure -p no:cacheprovider > "$OUT/pytest_gpu.txt" 2>&1 \
    || echo "GPU tests failed: see pytest_gpu.txt"
tail -n 3 "$OUT/pytest_gpu.txt"

# 5. Short tables last: the sweep, then the matmul fraction of forward vs train step side by side.
$LM table "$OUT/results.jsonl"
$LM table "$OUT/results.jsonl" --compare mode
ls -la "$OUT"
