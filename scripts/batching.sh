#!/usr/bin/env bash
# The batching protocol at full scale (docs/results/batching.md, "The full protocol in chunks"):
# HumanEval (164) and MBPP (first 200 test prompts), 256 new tokens, B = 1, 2, 4, 8, 16, five
# configurations, one process per task side by side with one thread each. benchmarks/bench_batch.py
# runs every cell of a chunk of about 24 prompts before the next chunk and keeps each cell as it
# ends, so the protocol goes on across sittings and clones:
#
#   UNTIL=HH:MM bash scripts/batching.sh run    # measure cells until UNTIL (local time), both tasks
#   bash scripts/batching.sh pack               # the summaries and figures, and the cells gzipped for a commit
#
# A chunk begun on another machine, or with another decode (a change under vskip/engine), begins
# again; complete chunks of each (machine, decode) are pooled apart. PY names the Python to run
# (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TASKS=(humaneval:164 mbpp:200)
out() { echo "docs/results/batching/protocol-$1"; }

case "${1:-}" in
  run)
    mkdir -p runs  # (the logs: not committed)
    pids=()
    for t in "${TASKS[@]}"; do
      task=${t%%:*} n=${t##*:}
      "$PY" benchmarks/bench_batch.py --task "$task" --limit "$n" --max-new-tokens 256 --batch 1,2,4,8,16 \
        --configs ar,default,strict,raw,prefix-full --repeats 1 --chunk-size 24 --threads 1 \
        --out "$(out "$task")" ${UNTIL:+--until "$UNTIL"} > "runs/batching-$task.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    ;;
  pack)
    for t in "${TASKS[@]}"; do
      d=$(out "${t%%:*}")
      [ -f "$d/cells.jsonl" ] || continue
      "$PY" benchmarks/bench_batch.py --summary --out "$d" > /dev/null
      gzip -nf "$d/cells.jsonl"
    done
    ;;
  *)
    echo "usage: UNTIL=HH:MM bash scripts/batching.sh run | bash scripts/batching.sh pack" >&2
    exit 2
    ;;
esac
