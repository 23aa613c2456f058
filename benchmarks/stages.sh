# Named stages within one wall-clock budget, shared by the GPU scripts (source it; bash 4+).
# The caller sets: STAGES (names to run, space-separated), ORDER (every stage name, in priority
# order), COST (associative array: estimated seconds per stage), deadline (SECONDS at which the
# budget ends), all before sourcing this file; optionally RESERVE_END (seconds kept for what
# follows the last stage), STAGE_LOG (a file that also receives the progress lines and the
# commands' output) and STAGE_MIN_S (default 20).
# Earlier stages have priority. When sourced, the selected stages are walked in order and those
# whose estimated costs fit in the budget are planned; a stage may use what is left of the budget
# minus the estimated cost of the planned stages after it. A stage that was not planned still
# runs if time is left when its turn comes, but nothing is reserved for it, so it can never
# starve an earlier stage.

say() {  # a progress line on stdout (and in STAGE_LOG)
  if [[ -n ${STAGE_LOG:-} ]]; then echo "$@" | tee -a "$STAGE_LOG"; else echo "$@"; fi
}

plan_stages() {  # plan_stages: the selected stages, in ORDER, whose estimated costs fit in the budget
  local budget=$((deadline - SECONDS - ${RESERVE_END:-0})) used=0 stage
  for stage in "${ORDER[@]}"; do
    [[ " $STAGES " == *" $stage "* ]] || continue
    if ((used + COST[$stage] <= budget)); then
      echo -n " $stage"
      used=$((used + COST[$stage]))
    fi
  done
}

reserve_after() {  # reserve_after NAME: RESERVE_END plus the estimated cost of planned stages after NAME
  local name=$1 after=0 total=${RESERVE_END:-0} stage
  for stage in "${ORDER[@]}"; do
    if ((after)) && [[ " $PLANNED " == *" $stage "* ]]; then total=$((total + COST[$stage])); fi
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

PLANNED="$(plan_stages) "
say "== planned within the budget:${PLANNED% }; the rest runs only if time is left"
