#!/usr/bin/env bash
# The conditioned drafter (docs/conditioned.md), one step per call; every step resumes.
#
#   bash scripts/conditioned.sh features   # verifier hidden states over the distillation answers -> $FEATS
#   bash scripts/conditioned.sh train      # train on them -> $TRAIN (checkpoints, curve), then export $TRAIN/drafter
#   bash scripts/conditioned.sh record     # $TRAIN's curve and the drafter's manifest (its settings) -> $R/$REC
#   SHIP=DIR bash scripts/conditioned.sh ship  # record, and $TRAIN/drafter -> DIR (a directory you choose)
#   bash scripts/conditioned.sh compare    # HumanEval and MBPP, paired with vskip compare -> $R/he, $R/mbpp
#   bash scripts/conditioned.sh skip       # raw confidence at the paper's gates and the prefix policy -> $R/skip
#   bash scripts/conditioned.sh pack       # gzip the finished comparisons' rows
#   bash scripts/conditioned.sh summary    # rebuild every summary in $R from its rows
#
# Knobs: FEATS, TRAIN (outside the repository: features take gigabytes), UNTIL (HH:MM: stop
# extracting or training then, resume later), HE and MBPP (prompts compared, the first ones), SKIP
# (HumanEval prompts of the skip comparison), NEW (new tokens, 512), DRAFTER (the drafter compared:
# the embedded one by default, or a directory such as $TRAIN/drafter before it ships), CONFIGS
# (the compare step's configurations), STEPS (the training schedule's length; a larger one extends a
# run), REC (where record puts a run's files under $R: train by default), SHIP (where ship puts the
# drafter: any directory outside vskip/; the script never writes into the package. Making it the
# embedded drafter is a commit that puts SHIP's files in vskip/assets/smollm2-135m-conditioned),
# VSKIP (the vskip to run, default .venv/bin/vskip).
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
FEATS=${FEATS:-../conditioned-features}
TRAIN=${TRAIN:-../conditioned-train}
R=docs/results/drafter-conditioned
NEW=${NEW:-512}
HE=${HE:-164}
MBPP=${MBPP:-200}
SKIP=${SKIP:-164}
CONFIGS=${CONFIGS:-ar,strict,strict+gamma=15,fast,lookup10}
UNTIL_FLAG=()
[ -n "${UNTIL:-}" ] && UNTIL_FLAG=(--until "$UNTIL")
D=${DRAFTER:-smollm2-135m-conditioned}
REC=${REC:-train}
STEPS_FLAG=()
[ -n "${STEPS:-}" ] && STEPS_FLAG=(--train-steps "$STEPS")

compare() {  # compare TASK N OUT CONFIGS
  mkdir -p "$3"
  "$VSKIP" compare --task "$1" --limit "$2" --max-new-tokens "$NEW" --drafter "$D" --configs "$4" --out "$3" --quiet
}

case "${1:-}" in
  features) "$VSKIP" extract-features --data datasets/distill --out "$FEATS" "${UNTIL_FLAG[@]}" ;;
  train)
    "$VSKIP" train-conditioned --data datasets/distill --features "$FEATS" --out "$TRAIN" "${UNTIL_FLAG[@]}" \
      "${STEPS_FLAG[@]}" ;;
  record)
    mkdir -p "$R/$REC" && cp "$TRAIN"/curve.png "$TRAIN"/curve.csv "$R/$REC/"
    cp "$TRAIN"/drafter/manifest.json "$R/$REC/manifest.json" ;;
  ship)
    [ -n "${SHIP:-}" ] || { echo "conditioned: ship needs SHIP=DIR, a directory outside vskip/" >&2; exit 2; }
    case "$(realpath -m "$SHIP")/" in
      "$(realpath vskip)"/*) echo "conditioned: SHIP=$SHIP lies inside the package (vskip/)" >&2; exit 2 ;;
    esac
    bash "$0" record
    mkdir -p "$SHIP" && cp -r "$TRAIN"/drafter/. "$SHIP"/ ;;
  compare)
    compare humaneval "$HE" $R/he "$CONFIGS"
    compare mbpp "$MBPP" $R/mbpp "$CONFIGS" ;;
  skip)
    compare humaneval "$SKIP" $R/skip \
      "ar,strict,raw+eta_b=0.9+eta_c=0.93+k_min=6,raw+eta_b=0.7+eta_c=0.7+k_min=3,prefix+lam=0.9" ;;
  pack)  # archive the rows once a comparison is done (a rerun then starts it afresh)
    for d in $R/he $R/mbpp $R/skip; do
      if [ -f "$d/shard-1-of-1.jsonl" ]; then gzip -f "$d/shard-1-of-1.jsonl"; fi
    done ;;
  summary)
    for d in $R/he $R/mbpp $R/skip; do
      if [ -d "$d" ]; then "$VSKIP" compare --summary --out "$d" > /dev/null; fi
    done ;;
  *) sed -n 2,22p "$0"; exit 2 ;;
esac
