# Named stages within one wall-clock budget, shared by the GPU scripts (source it; bash 4+).
# The caller sets: STAGES (names to run, space-separated), ORDER (every stage name, in run order),
# COST (associative array: estimated seconds per stage), deadline (SECONDS at which the budget
# ends); optionally RESERVE_END (seconds kept for what follows the last stage), STAGE_LOG (a file
# that also receives the progress lines and the commands' output) and STAGE_MIN_S (default 20).
# A stage may use what is left of the budget minus the estimated cost of the selected stages after
# it, so a subset of stages with a small budget reserves only for what it runs.

say() {  # a progress line on stdout (and in STAGE_LOG)
  if [[ -n ${STAGE_LOG:-} ]]; then echo "$@" | tee -a "$STAGE_LOG"; else echo "$@"; fi
}

reserve_after() {  # reserve_after NAME: RESERVE_END plus the estimated cost of selected stages after NAME
  local name=$1 after=0 total=${RESERVE_END:-0} stage
  for stage in "${ORDER[@]}"; do
    if ((after)) && [[ " $STAGES " == *" $stage "* ]]; then total=$((total + COST[$stage])); fi
    [[ $stage == "$name" ]] && after=1
  done
  echo "$total"
}

stage_limit() {  # stage_limit NAME: seconds the stage may use; 0 when it is not selected or no time is left
  local name=$1 left
  if [[ " $STAGES " != *" $name "* ]]; then echo 0; return 0; fi
  left=$((deadline - SECONDS - $(reserve_after "$name")))
  if ((left < ${STAGE_MIN_S:-20})); then
    say "== $name: skipped, out of budget" >&2
    echo 0
    return 0
  fi
  echo "$left"
}

run_stage() {  # run_stage NAME CMD...: CMD stopped with SIGINT at the stage's limit (points are kept)
  local name=$1 left rc
  shift
  left=$(stage_limit "$name")
  ((left > 0)) || return 0
  say "== $name (at most ${left} s)"
  if [[ -n ${STAGE_LOG:-} ]]; then
    timeout -s INT -k 20 "$left" "$@" >> "$STAGE_LOG" 2>&1
  else
    timeout -s INT -k 20 "$left" "$@"
  fi
  rc=$?
  ((rc == 0)) || say "== $name: exit $rc (124: stopped at its time limit; finished points are kept)"
}
