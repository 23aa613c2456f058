#!/usr/bin/env bash
# lmscope study (issue 18) on one GPU, in at most three runs of this script (each < 10 minutes):
# each run plans the points still missing in $RUN, runs what fits in BUDGET (default 8m50s; a run still going
# at the budget plus LATE_S, default 20 s, is interrupted: finished points are kept), and packs the
# run folder, without the large traces and snapshots, into $OUT/study.tgz, with its report.html
# and report.md beside it (the device tool brings back at most 8 files).
#   run 1, 2, 3:  OUT=<dir> bash benchmarks/study/run_gpu.sh      (same RUN folder every time)
# Resuming needs the JSONL files and study.json of the earlier runs in $RUN: on a machine that kept
# the repository's ignored files they are there; on a fresh one, unpack the last run's study.tgz
# into runs/ first (and carry runs/study-h100 with the device tool). The report is written after every run, so the
# last one has every section. Nothing to install: PYTHONPATH=src python3 -m lmscope.
set -u
OUT=${OUT:-runs/study-gpu-out}
RUN=${RUN:-runs/study-h100}
BUDGET=${BUDGET:-8m50s}
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$RUN"
LIMIT_S=$(( $(python3 -c "from lmscope.study.planner import parse_budget; print(int(parse_budget('$BUDGET')))") + ${LATE_S:-20} ))
timeout -s INT -k 20 "$LIMIT_S" python3 -m lmscope study --budget "$BUDGET" --resume --out "$RUN" 2>&1 \
  | tee -a "$RUN/log.txt"
python3 -m lmscope report "$RUN" -o "$RUN/report.html" 2>&1 | tee -a "$RUN/log.txt"
tar -C "$(dirname "$RUN")" --exclude='*.json.gz' --exclude='*.pickle' -czf "$OUT/study.tgz" "$(basename "$RUN")"
cp "$RUN/report.html" "$RUN/report.md" "$OUT/" 2>/dev/null
