#!/usr/bin/env bash
# Confirm an install on this machine's GPUs (or its CPU): tiny random Qwen3 and Dream checkpoints,
# the models on different devices, Strict SDD lossless against ar, one raw-confidence point,
# tokens/s and memory per device. A few minutes at most. Arguments go to scripts/gpu_check.py, run
# by the interpreter vskip is installed in: the one beside VSKIP (default .venv/bin/vskip).
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
exec "$(dirname "$VSKIP")/python" scripts/gpu_check.py "$@"
