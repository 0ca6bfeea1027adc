#!/usr/bin/env bash
# Beyond the paper: the prefix scheduler against the paper's signals, step by step; every step
# resumes where a kill left it (docs/prefix.md).
#
#   bash scripts/scheduler.sh traces    # Strict SDD traces: HumanEval (164) and MBPP (first 200 test prompts)
#   bash scripts/scheduler.sh train     # the paper's predictors and the prefix model, 5 folds over both tasks
#   bash scripts/scheduler.sh sweep     # the prefix grid and the paper's signals on both tasks
#   bash scripts/scheduler.sh onpolicy  # one DAgger-style round: decode with the model, retrain, sweep again
#   bash scripts/scheduler.sh report    # vskip report (with scheduler.json) and vskip diagnose
#
# R (default runs/scheduler) is where everything goes; MNT (256) the budget of new tokens; HE (164)
# and MBPP (200) the prompts of each task; DRAFTER (default: the embedded drafter) the drafter directory.
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
R=${R:-runs/scheduler}
MNT=${MNT:-256}
MODEL=(${DRAFTER:+--drafter "$DRAFTER"})
TASKS=("humaneval ${HE:-164}" "mbpp ${MBPP:-200}")

traces() {
  for t in "${TASKS[@]}"; do
    set -- $t
    $VSKIP run --task "$1" --limit "$2" --policy strict --trace --max-new-tokens "$MNT" --threads 2 --quiet \
      --out "$R/traces/$1" "${MODEL[@]}"
  done
}

train() {
  local traces=("$R/traces/humaneval" "$R/traces/mbpp")
  for kind in marginal conditional; do
    [ -f "$R/predictors/$kind/manifest.json" ] || \
      $VSKIP train-predictor --kind "$kind" --traces "${traces[@]}" --out "$R/predictors" --threads 2 --quiet
  done
  # two calibration folds of 73 prompts: conformal risk control at alpha needs 1/alpha - 1 of them
  [ -f "$R/predictors/prefix/manifest.json" ] || \
    $VSKIP train-predictor --kind prefix --traces "${traces[@]}" --out "$R/predictors" --calibration-folds 2 \
      --threads 2 --quiet
}

sweep() {  # $1: predictor directory, $2: sweep directory, $3: grids
  local pred=${1:-$R/predictors} out=${2:-$R/sweeps} grids=${3:-prefix cpu-signals}
  for t in "${TASKS[@]}"; do
    set -- $t
    for grid in $grids; do
      $VSKIP sweep --task "$1" --limit "$2" --grid "$grid" --predictor "$pred" --max-new-tokens "$MNT" \
        --workers 2 --threads 1 --quiet --out "$out/$1" "${MODEL[@]}"
    done
  done
}

onpolicy() {
  for t in "${TASKS[@]}"; do
    set -- $t
    $VSKIP run --task "$1" --limit "$2" --policy prefix --predictor "$R/predictors" --alpha 0.05 --trace \
      --max-new-tokens "$MNT" --threads 2 --quiet --out "$R/onpolicy1/$1" "${MODEL[@]}"
  done
  mkdir -p "$R/predictors-round1"
  [ -f "$R/predictors-round1/prefix/manifest.json" ] || \
    $VSKIP train-predictor --kind prefix --traces "$R/traces/humaneval" "$R/traces/mbpp" \
      --on-policy "$R/onpolicy1/humaneval" "$R/onpolicy1/mbpp" --out "$R/predictors-round1" \
      --calibration-folds 2 --threads 2 --quiet
  sweep "$R/predictors-round1" "$R/sweeps-round1" prefix  # the paper's signals do not change
}

report() {
  $VSKIP report "$R/sweeps" --out "$R/report"
  [ -d "$R/sweeps-round1" ] && $VSKIP report "$R/sweeps-round1" --out "$R/report-round1"
  $VSKIP diagnose "$R/traces/humaneval" "$R/traces/mbpp" --predictors "$R/predictors" --out "$R/diagnose"
}

case "${1:-}" in
  traces) traces ;;
  train) train ;;
  sweep) sweep ;;
  onpolicy) onpolicy ;;
  report) report ;;
  *) echo "usage: $0 traces|train|sweep|onpolicy|report" >&2; exit 2 ;;
esac
