#!/usr/bin/env bash
# The paper's verdicts and the prefix scheduler at full scale (docs/results/full.md): HumanEval
# (164) and MBPP (first 200 test prompts), 256 new tokens, the shipped drafter and defaults. The
# work is cut into pieces that each end in files a commit keeps, so that a fresh clone on another
# machine resumes where the last piece stopped:
#
#   bash scripts/fullscale.sh unpack   # restore the committed run directories under runs/full
#   bash scripts/fullscale.sh traces   # Strict SDD traces of both tasks (runs/full/traces; large, not committed)
#   bash scripts/fullscale.sh train    # marginal, conditional and prefix models, 5 folds -> $A/predictors
#   bash scripts/fullscale.sh sweep    # the grid `full` (cpu-signals and prefix) on both tasks, until UNTIL
#   bash scripts/fullscale.sh timing   # KEY on every 8th prompt, 3 repeats with the cache; NOCACHE_KEY on every 8th
#                                      # HumanEval prompt (NOCACHE_TASKS), without
#   bash scripts/fullscale.sh onpolicy # one on-policy round: traces (again, if missing), decode with the model, retrain
#   bash scripts/fullscale.sh onpolicy-check  # offline, same machine: thresholds replayed on the on-policy blocks
#   bash scripts/fullscale.sh onpolicy-sweep  # the retrained model at alpha 0.05, 0.02, 0.01 (grid `promise`)
#   ROUND=2 bash scripts/fullscale.sh onpolicy ...  # the next round: decode with round 1, retrain on both rounds
#   bash scripts/fullscale.sh pack     # the reports and their runs.tar.xz (every run, finished or not) -> $A/report*
#
# UNTIL (a time `date -d` reads, say 08:40) stops sweep, timing, onpolicy and onpolicy-sweep there:
# each process in flight loses at most the prompt it was decoding, and the next `unpack` and the
# same step go on from it. `onpolicy` must finish on the machine it started on: its traces (150 MB
# a task) are not committed, so a fresh machine makes them again (the same tokens: it checks). A
# configuration resumed on another machine mixes timings; every sample names its machine and the
# report says so. R (runs/full) is where runs go; A (docs/results/full) what is committed; MNT
# (256), HE (164) and MBPP (200) the budget and the prompts of each task; GRID (full) the sweep's
# grid, whose order puts what the verdicts need first; ROUND (1) the on-policy round the onpolicy
# steps make or read; ONLY (a task) narrows sweep, timing and onpolicy-sweep to that task. Round r decodes with round r-1's model at alpha 0.05 (round 0: the model trained
# on Strict SDD traces alone), trains on the Strict SDD blocks and on every round's on-policy blocks so
# far, and calibrates on round r's own, the blocks of the newest model's policy. The on-policy traces
# are not committed either, so every round after the first runs on the machine that made the earlier.
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
R=${R:-runs/full}
A=${A:-docs/results/full}
MNT=${MNT:-256}
TASKS=("humaneval ${HE:-164}" "mbpp ${MBPP:-200}")
# ONLY (a task) narrows sweep, onpolicy-sweep and timing to it, so that two steps can share the
# machine, one task each (a task that finished its part of one step gives its core to another)
if [ -n "${ONLY:-}" ]; then
  for t in "${TASKS[@]}"; do if [ "${t%% *}" = "$ONLY" ]; then TASKS=("$t"); break; fi; done
  [ "${#TASKS[@]}" -eq 1 ] && [ "${TASKS[0]%% *}" = "$ONLY" ] || { echo "fullscale: ONLY=$ONLY is not a task here" >&2; exit 2; }
fi
GRID=${GRID:-full}
ROUND=${ROUND:-1}
# the drafter's dtype pinned: `auto` is bfloat16 on a CPU with AVX512-BF16 or AMX and float32 without,
# and one run resumed on both kinds of machine would mix two drafters' confidences
PIN="--drafter-dtype float32"
PY=${PY:-.venv/bin/python}
# the points the timing piece repeats: the reference, Strict SDD, the promise at each alpha with the
# model of the second on-policy round (the scheduler as the study ends it), and raw (0.70, 0.70) at
# k_min 0, 3 and 6, the family H2 and Eq. 8 are read on (the other signals' speed is read by Eq. 7)
ROUND2="prefix+survival=model+predictor=$A/predictors-round2+alpha"
RAW="raw+eta_b=0.7+eta_c=0.7+k_min"
KEY=${KEY:-ar,strict,$ROUND2=0.05,$ROUND2=0.02,$ROUND2=0.01,$RAW=0,$RAW=3,$RAW=6}
# the points timed without the verifier's cache, as the paper timed, on every 8th prompt: a call that
# recomputes the whole sequence costs several cached ones here, and `ar` without its cache is the dearest
NOCACHE_KEY=${NOCACHE_KEY:-ar,strict,$ROUND2=0.05,$RAW=3}
# ... on the task the paper timed (an hour of the machine a task)
NOCACHE_TASKS=${NOCACHE_TASKS:-humaneval}

left() {  # seconds until UNTIL (ten days without it)
  if [ -n "${UNTIL:-}" ]; then echo $(( $(date -d "$UNTIL" +%s) - $(date +%s) )); else echo 864000; fi
}

waitall() {  # wait for the given pids; a timeout (124) at UNTIL is not a failure
  local pid r rc=0
  for pid in "$@"; do
    wait "$pid" || { r=$?; [ "$r" -eq 124 ] || rc=$r; }
  done
  return "$rc"
}

unpack() {
  # files already here are newer than the archive's: keep them
  local f
  for f in "$A/report/runs.tar.xz" "$A"/report-round*/runs.tar.xz; do
    if [ -f "$f" ]; then tar -xJf "$f" --skip-old-files; fi
  done
  for f in "$A"/timing/*/shard-*.jsonl.gz; do  # timing rows: a resumed comparison appends to them
    [ -f "$f" ] || continue
    local d="$R/timing/$(basename "$(dirname "$f")")"
    mkdir -p "$d"
    [ -f "$d/settings.json" ] || cp "$(dirname "$f")/settings.json" "$d/"
    [ -f "$d/$(basename "$f" .gz)" ] || gunzip -c "$f" > "$d/$(basename "$f" .gz)"
  done
}

traces() {  # one process per task, one thread each
  local pids=()
  for t in "${TASKS[@]}"; do
    set -- $t
    $VSKIP run --task "$1" --limit "$2" --policy strict --trace --max-new-tokens "$MNT" --threads 1 $PIN --quiet \
      --out "$R/traces/$1" &
    pids+=($!)
  done
  waitall "${pids[@]}"
}

train() {
  local traces=("$R/traces/humaneval" "$R/traces/mbpp")
  for t in humaneval mbpp; do  # what the traces were made with, and their Strict SDD summary
    mkdir -p "$A/traces/$t" && cp "$R/traces/$t/config.json" "$R/traces/$t/summary.json" "$A/traces/$t/"
  done
  for kind in marginal conditional; do
    [ -f "$A/predictors/$kind/manifest.json" ] || \
      $VSKIP train-predictor --kind "$kind" --traces "${traces[@]}" --out "$A/predictors" --threads 2 --quiet
  done
  # two calibration folds of about 146 prompts: conformal risk control at alpha needs 1/alpha - 1 of them
  [ -f "$A/predictors/prefix/manifest.json" ] || \
    $VSKIP train-predictor --kind prefix --traces "${traces[@]}" --out "$A/predictors" --calibration-folds 2 \
      --threads 2 --quiet
  # one thread, as onpolicy-check runs it: the same sums in the same order, the same digits
  $VSKIP diagnose "${traces[@]}" --predictors "$A/predictors" --out "$A/diagnose" --threads 1
}

sweep_both() {  # $1 grid, $2 predictors, $3 sweeps directory, $4 suffix of each task's directory: both tasks side by side
  local n pids=()
  n=$(left)
  if [ "$n" -le 60 ]; then echo "fullscale: $UNTIL has passed" >&2; return 0; fi
  for t in "${TASKS[@]}"; do
    set -- "$@" $t
    timeout -s TERM "$n" $VSKIP sweep --task "$5" --limit "$6" --grid "$1" --predictor "$2" \
      --max-new-tokens "$MNT" --workers 1 --threads 1 $PIN --quiet --out "$R/$3/$5$4" &
    pids+=($!)
    set -- "$1" "$2" "$3" "$4"
  done
  waitall "${pids[@]}"
}

sweep() {  # the grid on both tasks, one worker and one thread each, until UNTIL
  sweep_both "$GRID" "$A/predictors" sweeps ""
}

every() {  # $1 task, $2 prompts, $3 n: every n-th of the selected prompts, as --ids
  $PY - "$1" "$2" "$3" <<'PY'
import sys
from vskip.bench.tasks import load_task
task, limit, nth = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
print(",".join(p.task_id for p in load_task(task, limit=limit)[::nth]))
PY
}

timing() {  # the key points timed again, paired per prompt: 3 interleaved repeats with the cache, 1 without
  local ids kind cache repeats nth configs n pids
  for kind in cache nocache; do
    if [ "$kind" = cache ]; then
      cache=--verifier-cache repeats=3 nth=8 configs=$KEY
    else
      cache=--no-verifier-cache repeats=1 nth=8 configs=$NOCACHE_KEY
    fi
    for t in "${TASKS[@]}"; do
      set -- $t
      if [ "$kind" = nocache ] && [[ " $NOCACHE_TASKS " != *" $1 "* ]]; then continue; fi
      ids=$(every "$1" "$2" "$nth")
      n=$(left)
      if [ "$n" -le 60 ]; then echo "fullscale: $UNTIL has passed" >&2; return 0; fi
      pids=()
      for i in 1 2; do
        timeout -s TERM "$n" $VSKIP compare --task "$1" --ids "$ids" --max-new-tokens "$MNT" --threads 1 $PIN \
          $cache --no-shadow --repeats "$repeats" --predictor "$A/predictors" --configs "$configs" --shard "$i/2" \
          --quiet --out "$R/timing/$1-$kind" > /dev/null &
        pids+=($!)
      done
      waitall "${pids[@]}"
    done
  done
}

same_strict() {  # $1 task: the traced run committed what the committed traces' summary says
  $PY - "$R/traces/$1/summary.json" "$A/traces/$1/summary.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
keys = ("n_prompts", "generated_tokens", "verifier_calls", "draft_blocks", "pass_at_1")
if any(a[k] != b[k] for k in keys):
    sys.exit(f"fullscale: the traces made here differ from the committed ones: {[(k, a[k], b[k]) for k in keys]}")
PY
}

model_of() {  # $1 round: the prefix model of that round (round 0: trained on Strict SDD traces alone)
  if [ "$1" -le 0 ]; then echo "$A/predictors"; else echo "$A/predictors-round$1"; fi
}

onpolicy() {  # one DAgger-style round: decode with the last round's model, retrain on every round's blocks
  local n pids=() t i prev model onp=() r
  prev=$(model_of $((ROUND - 1)))
  [ -f "$prev/prefix/manifest.json" ] || { echo "fullscale: no model of round $((ROUND - 1)) ($prev)" >&2; return 2; }
  for i in $(seq 1 $((ROUND - 1))); do
    for t in humaneval mbpp; do
      [ -f "$R/onpolicy$i/$t/summary.json" ] || {
        echo "fullscale: round $ROUND trains on round $i's blocks too, which are not here: every round runs on one machine" >&2
        return 2; }
    done
  done
  n=$(left)
  for t in humaneval mbpp; do
    if [ ! -f "$R/traces/$t/summary.json" ]; then
      echo "fullscale: no traces here: making them again (a fresh machine)" >&2
      timeout -s TERM "$n" bash "$0" traces || { r=$?; [ "$r" -eq 124 ] || return "$r"; echo "fullscale: $UNTIL has passed" >&2; return 0; }
      break
    fi
  done
  for t in humaneval mbpp; do same_strict "$t"; done
  n=$(left)
  for t in "${TASKS[@]}"; do
    set -- $t
    timeout -s TERM "$n" $VSKIP run --task "$1" --limit "$2" --policy prefix --predictor "$prev" --alpha 0.05 \
      --trace --max-new-tokens "$MNT" --threads 1 $PIN --quiet --out "$R/onpolicy$ROUND/$1" &
    pids+=($!)
  done
  waitall "${pids[@]}"
  for t in humaneval mbpp; do
    if [ ! -f "$R/onpolicy$ROUND/$t/summary.json" ]; then  # stopped at UNTIL: not a failure; otherwise it is
      echo "fullscale: the on-policy run of $t is unfinished" >&2
      [ "$(left)" -le 60 ] && return 0
      return 1
    fi
  done
  # trained on every kind of block so far, its thresholds calibrated on this round's on-policy blocks,
  # the kind the policy meets after its own skips (docs/results/scheduler.md says why)
  for i in $(seq 1 "$ROUND"); do onp+=(--on-policy "$R/onpolicy$i/humaneval" "$R/onpolicy$i/mbpp"); done
  model=$(model_of "$ROUND")
  [ -f "$model/prefix/manifest.json" ] || \
    $VSKIP train-predictor --kind prefix --traces "$R/traces/humaneval" "$R/traces/mbpp" "${onp[@]}" \
      --calibrate-on on-policy --out "$model" --calibration-folds 2 --threads 2 --quiet
  for t in humaneval mbpp; do  # what the on-policy runs were, beside the retrained model
    mkdir -p "$A/onpolicy$ROUND/$t" && cp "$R/onpolicy$ROUND/$t/config.json" "$R/onpolicy$ROUND/$t/summary.json" \
      "$A/onpolicy$ROUND/$t/"
  done
}

onpolicy_check() {  # offline, on the machine that holds the traces: does each threshold hold on on-policy blocks?
  local st=("$R/traces/humaneval" "$R/traces/mbpp") on=("$R/onpolicy$ROUND/humaneval" "$R/onpolicy$ROUND/mbpp") t
  local prev=$((ROUND - 1))
  for t in "${on[@]}"; do [ -f "$t/summary.json" ] || { echo "fullscale: run onpolicy first" >&2; return 2; }; done
  if [ "$ROUND" -eq 1 ]; then
    # round 0 replayed on the Strict SDD blocks (piece 1's diagnostics, the replay added) and on the on-policy ones
    $VSKIP diagnose "${st[@]}" --predictors "$A/predictors" --out "$A/diagnose" --threads 1
    $VSKIP diagnose "${on[@]}" --predictors "$A/predictors" --out "$A/diagnose-onpolicy1" --threads 1
    # round 1 calibrated on Strict SDD blocks instead (the same training; not committed), beside round 1
    [ -f "$R/predictors-round1-strictcal/prefix/manifest.json" ] || \
      $VSKIP train-predictor --kind prefix --traces "${st[@]}" --on-policy "${on[@]}" --calibrate-on strict \
        --out "$R/predictors-round1-strictcal" --calibration-folds 2 --threads 2 --quiet
    $VSKIP diagnose "${on[@]}" --predictors "$A/predictors-round1" --out "$A/diagnose-onpolicy1-round1" --threads 1
    $VSKIP diagnose "${on[@]}" --predictors "$R/predictors-round1-strictcal" \
      --out "$A/diagnose-onpolicy1-round1-strictcal" --threads 1
  else
    # the last round's model on the blocks of its own policy (what it promised online), and this round's
    $VSKIP diagnose "${on[@]}" --predictors "$(model_of "$prev")" --out "$A/diagnose-onpolicy$ROUND-round$prev" --threads 1
    $VSKIP diagnose "${on[@]}" --predictors "$(model_of "$ROUND")" --out "$A/diagnose-onpolicy$ROUND-round$ROUND" \
      --threads 1
  fi
}

onpolicy_sweep() {  # the retrained model at the promised alphas, both tasks, until UNTIL
  local model
  model=$(model_of "$ROUND")
  [ -f "$model/prefix/manifest.json" ] || { echo "fullscale: run onpolicy first" >&2; return 2; }
  sweep_both promise "$model" "sweeps-round$ROUND" "-round$ROUND"
}

task_dirs() {  # $1 under $R, $2 suffix: the task directories that exist
  local t
  for t in "${TASKS[@]}"; do
    set -- "$1" "${2:-}" $t
    if [ -d "$R/$1/$3$2" ]; then echo "$R/$1/$3$2"; fi
  done
}

pack() {
  local d f out runs t
  for d in "$R"/timing/*/; do  # the timing rows, compressed, and their summary
    [ -f "$d/settings.json" ] || continue
    out="$A/timing/$(basename "$d")"
    mkdir -p "$out"
    cp "$d/settings.json" "$out/"
    for f in "$d"/shard-*.jsonl; do
      gzip -9nc "$f" > "$out/.tmp.gz" && mv "$out/.tmp.gz" "$out/$(basename "$f").gz"
    done
    $VSKIP compare --summary --out "$out" > /dev/null
  done
  # the repeated timings, committed: the reports set each promise's timed speed beside its single timing
  local timed=()
  for d in "$A"/timing/*/; do
    if [ -f "$d/settings.json" ]; then timed+=("${d%/}"); fi
  done
  if [ "${#timed[@]}" -gt 0 ]; then timed=(--timing "${timed[@]}"); fi
  # the signals' k_min in grid full is 3
  mapfile -t runs < <(task_dirs sweeps)
  if [ "${#runs[@]}" -gt 0 ]; then
    $VSKIP report "${runs[@]}" --frontier-k-min 3 "${timed[@]}" --archive --out "$A/report"
  fi
  # each on-policy round beside the runs it is measured against: Strict SDD, raw confidence's frontier
  # (its k_min 3 settings), round 0 and the earlier rounds at the same alphas
  local r i alphas=(prefix_model_a0.01_measured_s64 prefix_model_a0.02_measured_s64 prefix_model_a0.05_measured_s64)
  for r in $(seq 1 9); do
    mapfile -t runs < <(task_dirs "sweeps-round$r" "-round$r")
    [ "${#runs[@]}" -gt 0 ] || break
    for t in "${TASKS[@]}"; do
      set -- $t
      for d in strict "${alphas[@]}"; do
        if [ -d "$R/sweeps/$1/$d" ]; then runs+=("$R/sweeps/$1/$d"); fi
      done
      for d in "$R/sweeps/$1"/raw_*_k3_s64; do
        if [ -d "$d" ]; then runs+=("$d"); fi
      done
      for i in $(seq 1 $((r - 1))); do
        for d in "${alphas[@]}"; do
          if [ -d "$R/sweeps-round$i/$1-round$i/$d" ]; then runs+=("$R/sweeps-round$i/$1-round$i/$d"); fi
        done
      done
    done
    $VSKIP report "${runs[@]}" --frontier-k-min 3 "${timed[@]}" --archive --out "$A/report-round$r"
  done
  # the promise per alpha where docs/results/scheduler.md reads it: the newest round's report, which
  # holds that round, every earlier one and round 0 (each entry names its predictor)
  local newest=()
  mapfile -t newest < <(for d in "$A"/report-round*; do [ -d "$d" ] && printf '%s\n' "$d"; done | sort -V -r)
  for d in "${newest[@]}" "$A/report"; do
    if [ -f "$d/scheduler.json" ]; then cp "$d/scheduler.json" "$(dirname "$A")/scheduler.json"; break; fi
  done
}

case "${ONLY:+x}${1:-}" in
  x|xsweep|xtiming|xonpolicy-sweep) ;;
  x*) echo "fullscale: ONLY narrows sweep, timing and onpolicy-sweep, not ${1:-}" >&2; exit 2 ;;
esac
case "${1:-}" in
  unpack) unpack ;;
  traces) traces ;;
  train) train ;;
  sweep) sweep ;;
  timing) timing ;;
  onpolicy) onpolicy ;;
  onpolicy-check) onpolicy_check ;;
  onpolicy-sweep) onpolicy_sweep ;;
  pack) pack ;;
  *) echo "usage: $0 unpack|traces|train|sweep|timing|onpolicy|onpolicy-check|onpolicy-sweep|pack" >&2; exit 2 ;;
esac
