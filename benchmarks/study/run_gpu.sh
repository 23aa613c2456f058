#!/usr/bin/env bash
# lmscope study (issue 18) on one GPU, in at most three runs of this script (each < 10 minutes):
# each run plans the points still missing in $RUN, runs what fits in BUDGET (9m), and copies the
# run folder, without the large traces and snapshots, to $OUT with its report.
#   run 1, 2, 3:  OUT=<dir> bash benchmarks/study/run_gpu.sh      (same RUN folder every time)
# Resuming needs the JSONL files and study.json of the earlier runs in $RUN: on a machine that kept
# the repository's ignored files they are there; on a fresh one, put the folder the last run
# returned (its study-h100/) back at $RUN first. The report is written after every run, so the
# last one has every section. Nothing to install: PYTHONPATH=src python3 -m lmscope.
set -u
OUT=${OUT:-runs/study-gpu-out}
RUN=${RUN:-runs/study-h100}
BUDGET=${BUDGET:-9m}
export PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$RUN"
python3 -m lmscope study --budget "$BUDGET" --resume --out "$RUN" 2>&1 | tee -a "$RUN/log.txt"
python3 -m lmscope report "$RUN" -o "$RUN/report.html" 2>&1 | tee -a "$RUN/log.txt"
tar -C "$(dirname "$RUN")" --exclude='*.json.gz' --exclude='*.pickle' -cf - "$(basename "$RUN")" \
  | tar -C "$OUT" -xf -
