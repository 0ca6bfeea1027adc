#!/usr/bin/env bash
# Drafter v2, step by step; every step resumes where a kill left it.
#
#   bash scripts/drafter_v2.sh train   # train on every distillation answer (leakage-flagged ones excluded)
#   bash scripts/drafter_v2.sh prior   # fit the copy prior on the rows training held out
#   bash scripts/drafter_v2.sh eval    # HumanEval (164) and MBPP (first 100 test prompts), two processes
#   bash scripts/drafter_v2.sh report  # the tables of docs/results/drafter-v2/
#
# TRAIN (default runs/drafter-v2), STEPS (3000) and RUNS (runs/v2) name where things go.
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
TRAIN=${TRAIN:-runs/drafter-v2}
STEPS=${STEPS:-3000}
RUNS=${RUNS:-runs/v2}
D=$TRAIN/drafter

train() {
  $VSKIP train-drafter --data datasets/distill --out "$TRAIN" --train-steps "$STEPS" --holdout 384 --max-context 384 \
    --eval-every 250 --checkpoint-every 50 --threads 2
}

prior() {
  [ -f "$D/copy_prior.json" ] && { echo "copy prior already fitted: $D/copy_prior.json"; return; }
  $VSKIP fit-copy-prior --drafter "$D" --holdout-of "$TRAIN" --out "$D" --threads 2
}

# two processes of one thread each, so that the two cores are busy and no run shares a core
pair() { "$@" --shard 1/2 & local p1=$!; "$@" --shard 2/2 & local p2=$!; wait $p1 $p2; }

evaluate() {
  local common=(--drafter "$D" --threads 1 --quiet)
  # 64 new tokens, gamma 8: the network alone and the shipped default (copy prior on)
  $VSKIP run --task humaneval --policy strict --gamma 8 --max-new-tokens 64 --copy-prior off \
    --out "$RUNS/he64-net" "${common[@]}" &
  $VSKIP run --task humaneval --policy strict --gamma 8 --max-new-tokens 64 \
    --out "$RUNS/he64-default" "${common[@]}" &
  wait
  # 512 new tokens, paired with the verifier alone: lossless, tokens per call, speed
  pair $VSKIP compare --task humaneval --configs ar,strict,strict+gamma=16,strict+gamma=32 --max-new-tokens 512 \
    --out "$RUNS/he512" "${common[@]}"
  pair $VSKIP compare --task mbpp --limit 100 --configs ar,strict,strict+gamma=16,strict+gamma=32 --max-new-tokens 512 \
    --out "$RUNS/mbpp512" "${common[@]}"
  $VSKIP run --task mbpp --limit 100 --policy strict --gamma 8 --max-new-tokens 64 --copy-prior off \
    --out "$RUNS/mbpp64-net" "${common[@]}" &
  $VSKIP run --task mbpp --limit 100 --policy strict --gamma 8 --max-new-tokens 64 \
    --out "$RUNS/mbpp64-default" "${common[@]}" &
  wait
}

report() {
  local out=docs/results/drafter-v2
  mkdir -p "$out/he512" "$out/mbpp512"
  $VSKIP compare --summary --out "$RUNS/he512" > /dev/null && cp "$RUNS/he512/summary."{json,md} "$out/he512/"
  $VSKIP compare --summary --out "$RUNS/mbpp512" > /dev/null && cp "$RUNS/mbpp512/summary."{json,md} "$out/mbpp512/"
  # the network alone (rows "gamma=8 network") beside the default; no ar run, so no speed ratio here
  .venv/bin/python benchmarks/bench_drafter.py --runs "$RUNS/he64-net" "$RUNS/he64-default" --out "$out/he64"
  .venv/bin/python benchmarks/bench_drafter.py --runs "$RUNS/mbpp64-net" "$RUNS/mbpp64-default" --out "$out/mbpp64"
  cp "$TRAIN/curve.csv" "$TRAIN/curve.png" "$out/"
}

case "${1:-all}" in
  train) train ;;
  prior) prior ;;
  eval) evaluate ;;
  report) report ;;
  all) train; prior; evaluate; report ;;
  *) echo "usage: $0 train|prior|eval|report|all" >&2; exit 2 ;;
esac
