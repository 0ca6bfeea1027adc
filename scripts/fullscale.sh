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
#   bash scripts/fullscale.sh timing   # KEY points on every 4th prompt, paired: 3 repeats with the cache, 1 without
#   bash scripts/fullscale.sh onpolicy # one on-policy round of the prefix model, its alphas swept again
#   bash scripts/fullscale.sh pack     # the report and its runs.tar.xz (every run, finished or not) -> $A/report
#
# UNTIL (a time `date -d` reads, say 08:40) stops the sweep there: each task's run in flight loses
# at most the prompt it was decoding, and the next `unpack` + `sweep` goes on from it. A
# configuration resumed on another machine mixes timings; every sample names its machine and the
# report says so. R (runs/full) is where runs go; A (docs/results/full) what is committed; MNT
# (256), HE (164) and MBPP (200) the budget and the prompts of each task; GRID (full) the sweep's
# grid, whose order puts what the verdicts need first.
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
R=${R:-runs/full}
A=${A:-docs/results/full}
MNT=${MNT:-256}
TASKS=("humaneval ${HE:-164}" "mbpp ${MBPP:-200}")
GRID=${GRID:-full}
# the drafter's dtype pinned: `auto` is bfloat16 on a CPU with AVX512-BF16 or AMX and float32 without,
# and one run resumed on both kinds of machine would mix two drafters' confidences
PIN="--drafter-dtype float32"
PY=${PY:-.venv/bin/python}
# the points the timing piece repeats: the reference, Strict SDD, the promise, each signal, the product
KEY=${KEY:-ar,strict,prefix+survival=model+alpha=0.05,raw+eta_b=0.7+eta_c=0.7+k_min=3,marginal+eta_m=0.7+k_min=3,conditional+eta_b=0.7+eta_c=0.7+k_min=3,prefix+lam=0.7}

unpack() {
  # files already here are newer than the archive's: keep them
  local f
  for f in "$A/report/runs.tar.xz" "$A/report-round1/runs.tar.xz"; do
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
  for t in "${TASKS[@]}"; do
    set -- $t
    $VSKIP run --task "$1" --limit "$2" --policy strict --trace --max-new-tokens "$MNT" --threads 1 $PIN --quiet \
      --out "$R/traces/$1" &
  done
  wait
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
  $VSKIP diagnose "${traces[@]}" --predictors "$A/predictors" --out "$A/diagnose"
}

sweep() {  # both tasks side by side, one worker and one thread each, until UNTIL
  local left=864000 pids=() rc=0 r
  [ -n "${UNTIL:-}" ] && left=$(( $(date -d "$UNTIL" +%s) - $(date +%s) ))
  if [ "$left" -le 60 ]; then echo "fullscale: $UNTIL has passed" >&2; return 0; fi
  for t in "${TASKS[@]}"; do
    set -- $t
    timeout -s TERM "$left" $VSKIP sweep --task "$1" --limit "$2" --grid "$GRID" --predictor "$A/predictors" \
      --max-new-tokens "$MNT" --workers 1 --threads 1 $PIN --quiet --out "$R/sweeps/$1" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || { r=$?; [ "$r" -eq 124 ] || rc=$r; }
  done
  return "$rc"
}

every4th() {  # $1 task, $2 prompts: every fourth of the selected prompts, as --ids
  $PY -c "from vskip import tasks; print(','.join(p.task_id for p in tasks.load_task('$1', limit=$2)[::4]))"
}

timing() {  # the key points timed again, paired per prompt: 3 interleaved repeats with the cache, 1 without
  local ids kind cache repeats pids
  for kind in cache nocache; do
    if [ "$kind" = cache ]; then cache=--verifier-cache; repeats=3; else cache=--no-verifier-cache; repeats=1; fi
    for t in "${TASKS[@]}"; do
      set -- $t
      ids=$(every4th "$1" "$2")
      pids=()
      for i in 1 2; do
        $VSKIP compare --task "$1" --ids "$ids" --max-new-tokens "$MNT" --threads 1 $PIN $cache --no-shadow \
          --repeats "$repeats" --predictor "$A/predictors" --configs "$KEY" --shard "$i/2" --quiet \
          --out "$R/timing/$1-$kind" > /dev/null &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid"; done
    done
  done
}

onpolicy() {  # one DAgger-style round: decode with the prefix model, retrain it on those blocks too, sweep it
  local pids=()
  for t in "${TASKS[@]}"; do
    set -- $t
    $VSKIP run --task "$1" --limit "$2" --policy prefix --predictor "$A/predictors" --alpha 0.05 --trace \
      --max-new-tokens "$MNT" --threads 1 $PIN --quiet --out "$R/onpolicy1/$1" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  [ -f "$A/predictors-round1/prefix/manifest.json" ] || \
    $VSKIP train-predictor --kind prefix --traces "$R/traces/humaneval" "$R/traces/mbpp" \
      --on-policy "$R/onpolicy1/humaneval" "$R/onpolicy1/mbpp" --out "$A/predictors-round1" \
      --calibration-folds 2 --threads 2 --quiet
  for t in "${TASKS[@]}"; do
    set -- $t
    $VSKIP sweep --task "$1" --limit "$2" --grid prefix --predictor "$A/predictors-round1" \
      --max-new-tokens "$MNT" --workers 2 --threads 1 $PIN --quiet --out "$R/sweeps-round1/$1"
  done
}

task_dirs() {  # $1 under $R: the task directories that exist
  local t
  for t in "${TASKS[@]}"; do
    set -- "$1" $t
    if [ -d "$R/$1/$2" ]; then echo "$R/$1/$2"; fi
  done
}

pack() {
  local d f out runs
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
  # the signals' k_min in grid full is 3
  for d in sweeps sweeps-round1; do
    mapfile -t runs < <(task_dirs "$d")
    if [ "${#runs[@]}" -gt 0 ]; then
      $VSKIP report "${runs[@]}" --frontier-k-min 3 --archive --out "$A/report${d#sweeps}"
    fi
  done
}

case "${1:-}" in
  unpack) unpack ;;
  traces) traces ;;
  train) train ;;
  sweep) sweep ;;
  timing) timing ;;
  onpolicy) onpolicy ;;
  pack) pack ;;
  *) echo "usage: $0 unpack|traces|train|sweep|timing|onpolicy|pack" >&2; exit 2 ;;
esac
