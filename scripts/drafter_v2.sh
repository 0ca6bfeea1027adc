#!/usr/bin/env bash
# Drafter v2, step by step; every step resumes where a kill left it.
#
#   bash scripts/drafter_v2.sh train    # train on every distillation answer (leakage-flagged ones excluded)
#   bash scripts/drafter_v2.sh tune     # v3: train v2 further on early, fully masked blocks (see tune below)
#   bash scripts/drafter_v2.sh probe    # a 12-layer drafter's first 250 steps (PROBE_STEPS), beside v2's curve
#   bash scripts/drafter_v2.sh probe_report  # its losses and curve beside v2's, into OUT/probe-l12
#   bash scripts/drafter_v2.sh ship     # copy the trained network into SHIP (the old copy prior goes), which
#                                       # the runs below decode with; the package is never written
#   bash scripts/drafter_v2.sh prior    # fit the copy prior on the rows training held out
#   bash scripts/drafter_v2.sh net64    # the network alone (--copy-prior off), 64 new tokens, gamma 8
#   bash scripts/drafter_v2.sh eval64   # the shipped default, 64 new tokens, gamma 8 (both tasks at once)
#   bash scripts/drafter_v2.sh he512    # HumanEval (164) at 512 new tokens, paired with the verifier alone
#   bash scripts/drafter_v2.sh mbpp512  # MBPP (first 100 test prompts) at 512 new tokens, paired
#   bash scripts/drafter_v2.sh evaluate # prior, net64, eval64, he512, mbpp512 as two one-thread queues
#   bash scripts/drafter_v2.sh report   # the tables of docs/results/drafter-v2/
#
# TRAIN (default runs/drafter-v2), STEPS (1200), RUNS (runs/v2), OUT (docs/results/drafter-v2) name
# where things go; SHIP (default RUNS/drafter; any directory outside vskip/) where `ship` puts the
# network and `prior` its copy prior; DRAFTER (default: SHIP) the drafter the runs use; THREADS (2)
# the threads of `prior`, which `net64` can share the machine with at THREADS=1; VSKIP the vskip
# to run (default .venv/bin/vskip). Making the trained drafter the embedded one is a commit that
# puts SHIP's files in vskip/assets/smollm2-135m-diffusion.
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
TRAIN=${TRAIN:-runs/drafter-v2}
STEPS=${STEPS:-1200}
RUNS=${RUNS:-runs/v2}
SHIP=${SHIP:-$RUNS/drafter}
case "$(realpath -m "$SHIP")/" in
  "$(realpath vskip)"/*) echo "drafter_v2: SHIP=$SHIP lies inside the package (vskip/)" >&2; exit 2 ;;
esac
COMMON=(--drafter "${DRAFTER:-$SHIP}" --threads 1 --quiet)
PY=$(dirname "$VSKIP")/python  # the interpreter vskip is installed in, for the scripts under benchmarks/
CONFIGS=ar,strict,strict+gamma=16

train() {
  "$VSKIP" train-drafter --data datasets/distill --out "$TRAIN" --train-steps "$STEPS" --holdout 384 --max-context 384 \
    --eval-every 250 --checkpoint-every 50 --threads 2
}

# v3: v2's weights (FROM) trained TUNE_STEPS (600) steps more, half of the block starts inside the first 64
# answer tokens and most blocks fully masked, as one reveal step sees them. Then ship, evaluate and report
# it with TRAIN=runs/drafter-v3 RUNS=runs/v3 OUT=docs/results/drafter-v3.
tune() {
  "$VSKIP" train-drafter --data datasets/distill --out "${TUNE:-runs/drafter-v3}" \
    --init-from "${FROM:-runs/drafter-v2}" \
    --train-steps "${TUNE_STEPS:-600}" --lr 2e-4 --warmup 20 --holdout 384 --max-context 384 --early-share 0.5 \
    --early-tokens 64 --full-mask-share 0.85 --eval-every 150 --checkpoint-every 50 --threads 2
}

# the capacity probe: a drafter of 12 verifier layers (c_D about twice v2's) on v2's recipe and schedule, to
# compare with v2's curve at the same steps (PROBE_STEPS, default 250, of the 1,200-step schedule; resumable)
probe() {
  "$VSKIP" train-drafter --data datasets/distill --out "${PROBE:-runs/drafter-l12}" --num-layers 12 \
    --train-steps 1200 --stop-at-step "${PROBE_STEPS:-250}" --holdout 384 --max-context 384 --eval-every 125 \
    --checkpoint-every 50 --threads 2
}

# the probe beside v2, step for step on the same batches, into OUT/probe-l12
probe_report() {
  local out=${OUT:-docs/results/drafter-v3}/probe-l12 dir=${PROBE:-runs/drafter-l12}
  "$PY" benchmarks/compare_training.py "$TRAIN" "$dir" --upto "${PROBE_STEPS:-250}" --window 50 --out "$out"
  cp "$dir/curve.csv" "$dir/curve.png" "$dir/config.json" "$out/"
}

ship() {
  [ -f "$TRAIN/drafter/manifest.json" ] || "$VSKIP" train-drafter --data datasets/distill --out "$TRAIN" --export
  mkdir -p "$SHIP"
  cp "$TRAIN/drafter/"{drafter.safetensors,drafter.json,manifest.json} "$SHIP/"
  rm -f "$SHIP/copy_prior.json"  # fitted to the old network
}

prior() {
  [ -f "$SHIP/copy_prior.json" ] && { echo "copy prior already fitted: $SHIP/copy_prior.json"; return; }
  "$VSKIP" fit-copy-prior --drafter "$SHIP" --holdout-of "$TRAIN" --out "$SHIP" --threads "${THREADS:-2}"
}

# two processes of one thread each, so that the two cores are busy and no run shares a core
pair() { "$@" --shard 1/2 & local p1=$!; "$@" --shard 2/2 & local p2=$!; wait $p1 $p2; }

net64() {
  "$VSKIP" run --task humaneval --policy strict --gamma 8 --max-new-tokens 64 --copy-prior off \
    --out "$RUNS/he64-net" "${COMMON[@]}"
  "$VSKIP" run --task mbpp --limit 100 --policy strict --gamma 8 --max-new-tokens 64 --copy-prior off \
    --out "$RUNS/mbpp64-net" "${COMMON[@]}"
}

eval64() {
  "$VSKIP" run --task humaneval --policy strict --gamma 8 --max-new-tokens 64 --out "$RUNS/he64-default" \
    "${COMMON[@]}" &
  "$VSKIP" run --task mbpp --limit 100 --policy strict --gamma 8 --max-new-tokens 64 --out "$RUNS/mbpp64-default" \
    "${COMMON[@]}" &
  wait
}

he512() {
  pair "$VSKIP" compare --task humaneval --configs "$CONFIGS" --max-new-tokens 512 --out "$RUNS/he512" "${COMMON[@]}"
}
mbpp512() {
  pair "$VSKIP" compare --task mbpp --limit 100 --configs "$CONFIGS" --max-new-tokens 512 --out "$RUNS/mbpp512" \
    "${COMMON[@]}"
}

# The evaluation as two queues of one-thread jobs, so both cores stay busy: the fit of the prior and the
# runs that need it on one, the network-alone runs (which do not) on the other, then each queue takes one
# shard of the 512-token comparisons. Each job resumes.
evaluate() {
  local hec=(--task humaneval) mbc=(--task mbpp --limit 100) s64=(--policy strict --gamma 8 --max-new-tokens 64)
  local c512=(--configs "$CONFIGS" --max-new-tokens 512)
  {
    THREADS=1 prior
    "$VSKIP" run "${hec[@]}" "${s64[@]}" --out "$RUNS/he64-default" "${COMMON[@]}"
    "$VSKIP" run "${mbc[@]}" "${s64[@]}" --out "$RUNS/mbpp64-default" "${COMMON[@]}"
    "$VSKIP" compare "${hec[@]}" "${c512[@]}" --out "$RUNS/he512" "${COMMON[@]}" --shard 1/2
    "$VSKIP" compare "${mbc[@]}" "${c512[@]}" --out "$RUNS/mbpp512" "${COMMON[@]}" --shard 1/2
  } & local a=$!
  {
    "$VSKIP" run "${hec[@]}" "${s64[@]}" --copy-prior off --out "$RUNS/he64-net" "${COMMON[@]}"
    "$VSKIP" run "${mbc[@]}" "${s64[@]}" --copy-prior off --out "$RUNS/mbpp64-net" "${COMMON[@]}"
    until [ -f "$SHIP/copy_prior.json" ]; do sleep 10; done
    "$VSKIP" compare "${hec[@]}" "${c512[@]}" --out "$RUNS/he512" "${COMMON[@]}" --shard 2/2
    "$VSKIP" compare "${mbc[@]}" "${c512[@]}" --out "$RUNS/mbpp512" "${COMMON[@]}" --shard 2/2
  } & local b=$!
  wait $a $b
}

report() {
  local out=${OUT:-docs/results/drafter-v2}
  for r in he512 mbpp512; do
    [ -d "$RUNS/$r" ] || continue
    mkdir -p "$out/$r"
    "$VSKIP" compare --summary --out "$RUNS/$r" > /dev/null && cp "$RUNS/$r/summary."{json,md} "$out/$r/"
    # the rows themselves (outputs included), compressed: `vskip compare --summary` reads them back
    for f in "$RUNS/$r"/shard-*.jsonl; do gzip -9nc "$f" > "$out/$r/$(basename "$f").gz"; done
  done
  # the network alone (rows "gamma=8 network") beside the default; outputs checked against the ar
  # answers of an ar run at the same budget (RUNS/he64-ar, RUNS/mbpp64-ar) or else of the 512-token comparison
  local -A ref=([he64]=he512 [mbpp64]=mbpp512)
  for t in he64 mbpp64; do
    [ -d "$RUNS/$t-net" ] && [ -d "$RUNS/$t-default" ] || continue
    local against=()
    [ -d "$RUNS/${ref[$t]}" ] && against=(--reference "$RUNS/${ref[$t]}")
    [ -d "$RUNS/$t-ar" ] && against=(--reference "$RUNS/$t-ar")
    "$PY" benchmarks/bench_drafter.py --runs "$RUNS/$t-net" "$RUNS/$t-default" "${against[@]}" --out "$out/$t"
    local dirs=("$t-net" "$t-default")
    [ -d "$RUNS/$t-ar" ] && dirs+=("$t-ar")
    tar -C "$RUNS" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cJf "$out/$t/runs.tar.xz" "${dirs[@]}"
  done
  mkdir -p "$out/train"
  cp "$TRAIN/curve.csv" "$TRAIN/curve.png" "$TRAIN/config.json" "$out/train/"
  cp "$SHIP/manifest.json" "$out/train/drafter_manifest.json"
  [ -f "$SHIP/copy_prior.json" ] && cp "$SHIP/copy_prior.json" "$out/train/"
}

case "${1:-}" in
  train|tune|probe|probe_report|ship|prior|net64|eval64|he512|mbpp512|evaluate|report) "$1" ;;
  *) echo "usage: $0 train|tune|probe|probe_report|ship|prior|net64|eval64|he512|mbpp512|evaluate|report" >&2; exit 2 ;;
esac
