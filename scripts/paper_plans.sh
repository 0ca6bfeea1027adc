#!/usr/bin/env bash
# Memory plans of the paper's pair (DiffuCoder-7B-Instruct drafter, Qwen3-32B verifier, from their
# published config.json files in tests/data/paper) on 1x80 GB, 2x40 GB and 2x80 GB, in the paper's
# setting (bfloat16, gamma 32, no verifier cache, a 1,024-token prompt and 512 new tokens).
# Writes docs/results/gpu/plan-*.json and .md. No GPU and no weights are needed. VSKIP names the
# vskip to run (default .venv/bin/vskip).
set -uo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
OUT=docs/results/gpu
mkdir -p "$OUT"
PAIR=(--drafter tests/data/paper/DiffuCoder-7B-Instruct --verifier tests/data/paper/Qwen3-32B --gamma 32
      --no-verifier-cache)
plan() {
  name=$1
  shift
  "$VSKIP" plan "${PAIR[@]}" "$@" --out "$OUT/plan-$name.json" > /dev/null
  echo "$name: exit $?"
}
plan 1x80-shared      --device cuda:0 --max-memory 0=80GiB
plan 2x40-apart       --drafter-device cuda:0 --verifier-device cuda:1 --max-memory 0=40GiB,1=40GiB
plan 2x40-balanced    --drafter-device cuda:0 --verifier-device balanced --max-memory 0=40GiB,1=40GiB
plan 2x80-apart       --drafter-device cuda:0 --verifier-device cuda:1 --max-memory 0=80GiB,1=80GiB
plan 2x80-balanced    --drafter-device cuda:0 --verifier-device balanced --max-memory 0=80GiB,1=80GiB
