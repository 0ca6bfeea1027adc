#!/usr/bin/env bash
# The prefix scheduler calibrated online on its own decodes, and tested on prompts disjoint from
# everything that chose it (docs/prefix.md, "Calibrated online"; docs/results/scheduler.md).
#
#   bash scripts/online.sh init     # rotation 0 of the full-scale prefix model, and its prompt ids
#   bash scripts/online.sh cal      # its calibration prompts at lam 0.95 .. 0.70, both tasks side by side
#   bash scripts/online.sh choose   # the thresholds at alpha 0.05 and 0.02 from the finished thresholds
#   bash scripts/online.sh test     # its test prompts: Strict SDD and alpha 0.05, 0.02, both tasks side by side
#   bash scripts/online.sh report   # the report of the test runs and of the calibration runs, with their archives
#   bash scripts/online.sh unpack   # the committed runs back under runs/online
#
# UNTIL=HH:MM stops cal and test there (a stopped step resumes where it stopped). The grid is
# decoded from the most cautious threshold down; `choose` reads the thresholds every calibration
# prompt finished, so a calibration stopped early chooses on the top of the grid.
set -euo pipefail
cd "$(dirname "$0")/.."

VSKIP=${VSKIP:-.venv/bin/vskip}
A=${A:-docs/results/online}         # committed: the one-rotation model, its choice, the reports
R=${R:-runs/online}                # the run directories (packed into the reports' archives)
P=$A/predictor
MNT=128
TASKS=(humaneval mbpp)
ALPHAS=(--alpha 0.05 --alpha 0.02)

left() {  # seconds until UNTIL (ten days without it)
  if [ -n "${UNTIL:-}" ]; then echo $(( $(date -d "$UNTIL" +%s) - $(date +%s) )); else echo 864000; fi
}

both() {  # $1 grid, $2 ids suffix (cal or test), $3 out: both tasks side by side, one thread each
  local n t pid rc=0 r pids=()
  n=$(left)
  if [ "$n" -le 60 ]; then echo "online: $UNTIL has passed" >&2; return 0; fi
  for t in "${TASKS[@]}"; do
    timeout -s TERM "$n" $VSKIP sweep --task "$t" --grid "$1" --ids "$(cat "$P/ids/$t.$2")" --predictor "$P" \
      --max-new-tokens "$MNT" --threads 1 --quiet --out "$R/$3/$t" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { r=$?; [ "$r" -eq 124 ] || rc=$r; }
  done
  return "$rc"
}

finished() {  # the calibration runs of the thresholds every task finished
  local d lam ok
  for d in "$R"/cal/humaneval/prefix_model_lam*; do
    lam=$(basename "$d")
    ok=1
    for t in "${TASKS[@]}"; do [ -f "$R/cal/$t/$lam/summary.json" ] || ok=0; done
    if [ "$ok" = 1 ]; then for t in "${TASKS[@]}"; do echo "$R/cal/$t/$lam"; done; fi
  done
}

case "${1:-}" in
  init) $VSKIP calibrate-online init --predictor docs/results/full/predictors --rotation 0 --out "$P" ;;
  cal) both online-cal cal cal ;;
  choose)
    mapfile -t runs < <(finished)
    [ "${#runs[@]}" -gt 0 ] || { echo "online: no threshold has finished on every task" >&2; exit 1; }
    $VSKIP calibrate-online choose "$P" "${runs[@]}" "${ALPHAS[@]}" ;;
  test) both online-test test test ;;
  report)
    $VSKIP report "$R"/test/* --archive --out "$A/test-report"
    mapfile -t runs < <(finished)
    $VSKIP report "${runs[@]}" --archive --out "$A/cal-report" ;;
  unpack)
    for f in "$A/test-report/runs.tar.xz" "$A/cal-report/runs.tar.xz"; do
      if [ -f "$f" ]; then tar -xJf "$f" --skip-old-files; fi
    done ;;
  *) echo "usage: $0 init|cal|choose|test|report|unpack" >&2; exit 2 ;;
esac
