"""The run directory: the names of its files and the one way to read, resume and append them.

A run directory holds ``config.json`` (the resolved configuration), ``samples.jsonl`` (one line
per finished prompt), ``rounds.jsonl`` (one line per round), ``summary.json`` (written last) and,
for ``--trace`` runs, ``traces/``. A sweep directory holds ``sweep.json`` and one run directory per
configuration. :func:`resume_state` is what makes a resumed run equal to an unbroken one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .files import FileError, naming, open_append, read_jsonl, write_jsonl

CONFIG = "config.json"
SAMPLES = "samples.jsonl"
ROUNDS = "rounds.jsonl"
SUMMARY = "summary.json"
SWEEP = "sweep.json"
TRACE_DIR = "traces"


def read_rows(path: Path) -> list[dict]:
    """A run file's rows; each must name its prompt (``task_id``)."""
    rows = read_jsonl(path, on_cut=lambda msg: print(f"[vskip] {msg}; it is redone", file=sys.stderr))
    for i, r in enumerate(rows):
        if not isinstance(r.get("task_id"), str):
            raise FileError(f"{path}: row {i + 1} has no task_id; the run directory is damaged")
    return rows


def row_key(row: dict) -> tuple[str, int]:
    """Which completion a row belongs to: its prompt and, with ``--samples-per-prompt``, the
    sample's index (rows of single-sample runs carry none: 0)."""
    return row["task_id"], int(row.get("sample", 0))


def resume_state(out: Path) -> tuple[dict[tuple[str, int], dict], list[dict]]:
    """The finished completions of a run directory ((task id, sample) -> sample row) and their rounds, made
    consistent: a prompt counts as finished only when its sample line is whole and its rounds add
    up (a sample records how many rounds it wrote); anything else is dropped and redone. Both
    files are rewritten to what is kept."""
    samples = read_rows(out / SAMPLES)
    rounds = read_rows(out / ROUNDS)
    count: dict[tuple[str, int], int] = {}
    for r in rounds:
        count[row_key(r)] = count.get(row_key(r), 0) + 1
    done = {}
    for s in samples:
        want = s.get("rounds")
        if want is None or count.get(row_key(s), 0) == want:
            done[row_key(s)] = s
        else:
            print(f"[vskip] {out}: {s['task_id']} has {count.get(row_key(s), 0)} of its {want} rounds; "
                  "it is redone", file=sys.stderr)
    kept = [r for r in rounds if row_key(r) in done]
    write_jsonl(out / ROUNDS, kept)
    write_jsonl(out / SAMPLES, done.values())
    return done, kept


def append_lines(path: Path, text: str) -> None:
    """Append whole lines and flush them to disk before the next write depends on them."""
    with naming(path), open_append(path) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
