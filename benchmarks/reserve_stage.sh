# `stage NAME RESERVE_S COMMAND...` for the GPU scripts that give each stage what is left of one
# budget minus a fixed reserve for the stages after it (source it; bash 4+). The caller sets
# STAGES (names to run, space-separated) and deadline (SECONDS at which the budget ends). A stage
# left with under 20 s is skipped; one that reaches its limit is stopped with SIGINT, so its
# finished points are kept and a rerun with STAGES=NAME resumes it.
stage() {  # stage NAME RESERVE_S COMMAND...: run COMMAND if NAME is in STAGES and time is left
  local name=$1 reserve=$2
  shift 2
  [[ " $STAGES " == *" $name "* ]] || return 0
  local left=$((deadline - SECONDS - reserve))
  if ((left < 20)); then
    echo "== $name: skipped, out of budget"
    return 0
  fi
  echo "== $name (at most ${left} s, $((SECONDS)) s elapsed)"
  timeout -s INT -k 20 "$left" "$@"
  local rc=$?
  ((rc == 0)) || echo "== $name: exit $rc (124: stopped at its time limit; finished points are kept)"
}
