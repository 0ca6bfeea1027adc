#!/usr/bin/env bash
# The prefix scheduler calibrated online on its own decodes, and tested on prompts disjoint from
# everything that chose it (docs/prefix.md, "Calibrated online"; docs/results/scheduler.md). Each
# step is `vskip calibrate-online` or `vskip report`:
#
#   bash scripts/online.sh init     # rotation 0 of the full-scale prefix model, and its prompt ids
#   bash scripts/online.sh cal      # its calibration prompts at lam 0.95 .. 0.60, both tasks side by side
#   bash scripts/online.sh choose   # the thresholds at alpha 0.05 and 0.02 from the finished thresholds
#   bash scripts/online.sh test     # its test prompts: Strict SDD and alpha 0.05, 0.02, both tasks side by side
#   bash scripts/online.sh report   # the report of the test runs and of the calibration runs, with their archives
#   bash scripts/online.sh unpack   # the committed runs back under runs/online
#
# UNTIL=HH:MM stops cal and test there (a stopped step resumes where it stopped). The grid is
# decoded from the most cautious threshold down; `choose` and `report` read the thresholds every
# task finished (`vskip calibrate-online finished`), so a calibration stopped early chooses on the
# top of the grid. VSKIP names the vskip to run (default: .venv/bin/vskip). MNT is the output budget
# (default 128, as the committed study in docs/results/online ran) and BATCH the prompts each task
# decodes at once (default 1; the thresholds hold for the policy as it ran, so cal and test take
# the same BATCH). The study at 256 tokens keeps its own model, choice and runs:
#
#   A=docs/results/online-256 R=runs/online-256 MNT=256 BATCH=8 bash scripts/online.sh init   # (then cal, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
A=${A:-docs/results/online}         # committed: the one-rotation model, its choice, the reports
R=${R:-runs/online}                # the run directories (packed into the reports' archives)
P=$A/predictor
MNT=${MNT:-128}
BATCH=${BATCH:-1}
UNTIL_FLAG=()
[ -z "${UNTIL:-}" ] || UNTIL_FLAG=(--until "$UNTIL")

case "${1:-}" in
  init) "$VSKIP" calibrate-online init --predictor docs/results/full/predictors --rotation 0 --out "$P" ;;
  cal|test) "$VSKIP" calibrate-online sweep "$1" "$P" --out "$R/$1" --max-new-tokens "$MNT" --batch-size "$BATCH" "${UNTIL_FLAG[@]}" ;;
  choose)
    mapfile -t runs < <("$VSKIP" calibrate-online finished "$P" "$R/cal")
    [ "${#runs[@]}" -gt 0 ] || exit 1
    "$VSKIP" calibrate-online choose "$P" "${runs[@]}" ;;  # at the risks grid online-test decodes at
  report)
    "$VSKIP" report "$R"/test/* --archive --out "$A/test-report"
    mapfile -t runs < <("$VSKIP" calibrate-online finished "$P" "$R/cal")
    [ "${#runs[@]}" -gt 0 ] || exit 1
    "$VSKIP" report "${runs[@]}" --archive --out "$A/cal-report" ;;
  unpack)
    for f in "$A/test-report/runs.tar.xz" "$A/cal-report/runs.tar.xz"; do
      if [ -f "$f" ]; then tar -xJf "$f" --skip-old-files; fi
    done ;;
  *) echo "usage: $0 init|cal|choose|test|report|unpack" >&2; exit 2 ;;
esac
