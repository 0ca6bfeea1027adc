#!/usr/bin/env bash
# The rest of the sampling protocol, batched (docs/results/sampling.md): all 164 HumanEval prompts at
# temperatures 0.2 and 1.0 (ar, Strict SDD with the coupled rule, raw confidence at the paper's
# gates, paired per prompt), and pass@10 with ten completions per prompt at 0.6 for `ar` and for
# Strict SDD with the standard rule (the ten completions of a prompt are one batch).
#
#   UNTIL=HH:MM bash scripts/sampling.sh temps   # both temperatures, two shards side by side
#   UNTIL=HH:MM bash scripts/sampling.sh passk   # ar and the standard rule, PARTS parts each, two at a time
#   bash scripts/sampling.sh pack                # summaries and scores into docs/results/sampling, rows gzipped
#
# The runs go under R (default runs/sampling; not committed: the passk runs' rounds are not kept).
# Every step resumes where it stopped (UNTIL stops it; the prompt groups in flight are redone).
# pass@10 runs as PARTS parts (default 8; part I takes prompts I, I+PARTS, ... of the 164), so that
# it can span sittings: pack keeps each finished part's summary and samples in S, and once all of
# them are there scores them as one (score.json, with the decode's totals); passk skips the parts
# that S already keeps.
# Seeds are keyed by prompt and position, so a batch draws what batch 1 draws; outputs equal batch
# 1's up to floating-point near-ties, and the clocks time batches (x ar is at the same B).
# VSKIP names the vskip to run (default .venv/bin/vskip), B the temperatures' batch size (default 8),
# S where pack writes (default docs/results/sampling). pack scores the standard rule's completions
# paired by prompt with ar's (the difference of pass@k with an interval over prompts).
set -euo pipefail
cd "$(dirname "$0")/.."
VSKIP=${VSKIP:-.venv/bin/vskip}
B=${B:-8}
PARTS=${PARTS:-8}
S=${S:-docs/results/sampling}
R=${R:-runs/sampling}
COMMON=(--preset study --task humaneval --seed 0 --threads 1 --quiet)

END=""  # UNTIL (HH:MM today, even if already past, or YYYY-MM-DD HH:MM) as seconds since the epoch
if [ -n "${UNTIL:-}" ]; then END=$(date -d "$UNTIL" +%s) || exit 2; fi

until_() {  # run "$@" until END, if set; a stop there is not a failure, and nothing starts after it
  if [ -z "$END" ]; then "$@"; return; fi
  local left=$(( END - $(date +%s) ))
  if [ "$left" -le 0 ]; then return 0; fi
  timeout --signal=INT "$left" "$@" || [ $? -eq 124 ]
}

side_by_side() {  # the commands given as strings, each in the background; fails if one did
  local pids=() rc=0
  for c in "$@"; do eval "until_ $c" & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

case "${1:-}" in
  temps)
    for T in 0.2 1.0; do
      side_by_side \
        "$VSKIP compare ${COMMON[*]} --configs ar,strict,raw --temperature $T --batch-size $B --shard 1/2 --out $R/he164-T$T" \
        "$VSKIP compare ${COMMON[*]} --configs ar,strict,raw --temperature $T --batch-size $B --shard 2/2 --out $R/he164-T$T"
    done ;;
  passk)  # the parts as a queue: two processes take the next (policy, part) as each finishes
    for i in $(seq 1 "$PARTS"); do for p in ar strict-spec; do echo "$p $i"; done; done |
      xargs -P 2 -L 1 bash scripts/sampling.sh passk-part ;;
  passk-part)  # one policy on one part: prompts I, I+N, ... of the 164 (I counted from 1)
    p=$2 i=$3
    [[ "$p" =~ ^(ar|strict-spec)$ && "$i" =~ ^[0-9]+$ && "$i" -ge 1 && "$i" -le "$PARTS" ]] || { echo "bad part: $p $i" >&2; exit 2; }
    ids=$(seq -s, -f 'HumanEval/%g' $((i - 1)) "$PARTS" 163)
    if [ -f "$S/passk/$p-T0.6-n10/part-${i}of$PARTS/samples.jsonl.gz" ]; then exit 0; fi  # packed already
    flags=(--policy ar); [ "$p" = ar ] || flags=(--policy strict --speculative-sampling)
    until_ "$VSKIP" run "${COMMON[@]}" "${flags[@]}" --temperature 0.6 --samples-per-prompt 10 --batch-size 10 \
      --ids "$ids" --out "$R/passk/$p-T0.6-n10/part-${i}of$PARTS" ;;
  pack)
    for T in 0.2 1.0; do
      d=$R/he164-T$T o=$S/he164-T$T
      [ -d "$d" ] || continue
      "$VSKIP" compare --summary --score --out "$d" > /dev/null
      mkdir -p "$o"
      cp "$d"/settings.json "$d"/summary.json "$d"/summary.md "$d"/scores.json "$o"/
      for f in "$d"/shard-*.jsonl; do gzip -nc "$f" > "$o/$(basename "$f").gz"; done
    done
    shopt -s nullglob
    for r in ar-T0.6-n10 strict-spec-T0.6-n10; do  # each finished part into S; all PARTS scored as one
      o=$S/passk/$r
      for d in "$R/passk/$r"/part-*of"$PARTS"; do
        i=${d##*/part-} i=${i%of*}
        want=$(( $(seq $((i - 1)) "$PARTS" 163 | wc -l) * 10 ))  # ten completions of each of its prompts
        [ -f "$d/summary.json" ] && [ "$(wc -l < "$d/samples.jsonl")" -eq "$want" ] || continue
        mkdir -p "$o/${d##*/}"
        cp "$d/summary.json" "$o/${d##*/}"/
        gzip -nc "$d/samples.jsonl" > "$o/${d##*/}/samples.jsonl.gz"
      done
      parts=("$o"/part-*of"$PARTS"/samples.jsonl.gz)
      if [ "${#parts[@]}" -ne "$PARTS" ]; then echo "$r: ${#parts[@]} of $PARTS parts" >&2; continue; fi
      pair=()
      if [ "$r" != ar-T0.6-n10 ] && [ -f "$S/passk/ar-T0.6-n10/score.json" ]; then
        pair=(--paired-with "$S/passk/ar-T0.6-n10/score.json")
      fi
      "$VSKIP" score --task humaneval --samples "${parts[@]}" --out "$o/score.json" "${pair[@]}" > "$o/score.txt"
    done ;;
  *) echo "usage: UNTIL=HH:MM bash scripts/sampling.sh temps|passk | bash scripts/sampling.sh pack" >&2; exit 2 ;;
esac
