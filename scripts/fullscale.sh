#!/usr/bin/env bash
# The paper's verdicts and the prefix scheduler at full scale (docs/results/full.md): HumanEval
# (164) and MBPP (first 200 test prompts), 256 new tokens, the shipped drafter and defaults, in
# pieces that each end in files a commit keeps, so that a fresh clone on another machine resumes
# where the last piece stopped. Each piece is `vskip fullscale STEP` (its --help says more):
#
#   bash scripts/fullscale.sh unpack   # restore the committed run directories under runs/full
#   bash scripts/fullscale.sh traces   # Strict SDD traces of both tasks (runs/full/traces; large, not committed)
#   bash scripts/fullscale.sh train    # marginal, conditional and prefix models, 5 folds -> $A/predictors
#   bash scripts/fullscale.sh sweep    # the grid `full` (cpu-signals and prefix) on both tasks, until UNTIL
#   bash scripts/fullscale.sh timing   # the key points on every 8th prompt, 3 repeats with the cache, and on
#                                      # HumanEval (NOCACHE_TASKS) once without it
#   bash scripts/fullscale.sh onpolicy # one on-policy round: traces (again, if missing), decode with the model, retrain
#   bash scripts/fullscale.sh onpolicy-check  # offline, same machine: thresholds replayed on the on-policy blocks
#   bash scripts/fullscale.sh onpolicy-sweep  # the retrained model at alpha 0.05, 0.02, 0.01 (grid `promise`)
#   ROUND=2 bash scripts/fullscale.sh onpolicy ...  # the next round: decode with round 1, retrain on both rounds
#   bash scripts/fullscale.sh pack     # the reports and their runs.tar.xz (every run, finished or not) -> $A/report*
#
# UNTIL (HH:MM) stops sweep, timing, onpolicy and onpolicy-sweep there: each process in flight
# loses at most the prompt it was decoding, and the next `unpack` and the same step go on from it.
# `onpolicy` must finish on the machine it started on: its traces (150 MB a task) are not
# committed, so a fresh machine makes them again (the same tokens: it checks). A configuration
# resumed on another machine mixes timings; every sample names its machine and the report says
# so. R (runs/full) is where runs go; A (docs/results/full) what is committed; MNT (256) the
# budget; GRID (full) the sweep's grid, whose order puts what the verdicts need first; ROUND (1)
# the on-policy round the onpolicy steps make or read; ONLY (a task) narrows sweep, timing and
# onpolicy-sweep to that task, so that two steps can share the machine; KEY, NOCACHE_KEY and
# NOCACHE_TASKS what timing times; flags after the step go to vskip as they are (`--limit mbpp=N`:
# fewer prompts of a task). Round r decodes with round r-1's model at alpha 0.05 (round 0: the
# model trained on Strict SDD traces alone), trains on the Strict SDD blocks and on every round's
# on-policy blocks so far, and calibrates on round r's own, the blocks of the newest model's
# policy. VSKIP names the vskip to run (default: .venv/bin/vskip).
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
args=()
[ -z "${R:-}" ] || args+=(--runs "$R")
[ -z "${A:-}" ] || args+=(--results "$A")
[ -z "${MNT:-}" ] || args+=(--max-new-tokens "$MNT")
[ -z "${GRID:-}" ] || args+=(--grid "$GRID")
[ -z "${ROUND:-}" ] || args+=(--round "$ROUND")
[ -z "${ONLY:-}" ] || args+=(--only "$ONLY")
[ -z "${UNTIL:-}" ] || args+=(--until "$UNTIL")
[ -z "${KEY:-}" ] || args+=(--key "$KEY")
[ -z "${NOCACHE_KEY:-}" ] || args+=(--nocache-key "$NOCACHE_KEY")
[ -z "${NOCACHE_TASKS:-}" ] || args+=(--nocache-tasks "${NOCACHE_TASKS// /,}")
exec "$VSKIP" fullscale "$@" "${args[@]}"
