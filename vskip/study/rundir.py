"""The run directory: the names of its files, the one way to resume and append them, and
:func:`load_run`, the one reader of a finished or unfinished run (reports, calibration).

A run directory holds ``config.json`` (the resolved configuration), ``samples.jsonl`` (one line
per finished prompt), ``rounds.jsonl`` (one line per round), ``summary.json`` (written last) and,
for ``--trace`` runs, ``traces/``. A sweep directory holds ``sweep.json`` and one run directory per
configuration. :func:`resume_state` is what makes a resumed run equal to an unbroken one.

Rounds are written once: :func:`append_prompt` appends a prompt's :class:`RoundRow` lines, then its
sample line, which vouches for them; a resume truncates both files to the last whole prompt and
appends from there; :func:`read_rounds` is the one reader of the rows.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Sequence

from ..engine.policy import policy_params
from ..files import FileError, naming, open_append, read_json, read_jsonl

CONFIG = "config.json"
SAMPLES = "samples.jsonl"
ROUNDS = "rounds.jsonl"
SUMMARY = "summary.json"
SWEEP = "sweep.json"
TRACE_DIR = "traces"
RUN_FILES = (SAMPLES, SUMMARY, CONFIG)
#: the run files behind a report, packed beside it (``vskip report --archive``)
ARCHIVE = "runs.tar.xz"


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


@dataclass(frozen=True)
class RoundRow:
    """One line of ``rounds.jsonl``: the loop's :class:`vskip.engine.decode.RoundRecord` and the
    completion it belongs to (``sample``: None in a run of one completion per prompt). A field
    that a file written by an older version lacks reads as None."""

    task_id: str
    sample: int | None = None
    round: int | None = None
    verified: bool | None = None
    K: int | None = None
    K_hat: int | None = None
    L: int | None = None
    accepted: int | None = None
    committed: int | None = None
    relaxed: bool | None = None
    reason: str | None = None
    gamma: int | None = None

    @classmethod
    def of(cls, record, task_id: str, sample: int | None = None) -> "RoundRow":
        """The row of a loop's round record."""
        return cls(task_id=task_id, sample=sample, **asdict(record))

    @classmethod
    def from_json(cls, d: dict) -> "RoundRow":
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})

    def to_json(self) -> dict:
        d = asdict(self)
        if self.sample is None:
            del d["sample"]
        return d


def read_rounds(path: Path, notes: list[str] | None = None) -> list[RoundRow]:
    """The rows of a ``rounds.jsonl`` (``.gz`` too). With ``notes``, tolerant as reports are: a
    damaged file is read up to its first bad line and the damage noted; without, it raises."""
    if notes is None:
        return [RoundRow.from_json(r) for r in read_rows(path)]
    return [RoundRow.from_json(r) for r in _read_jsonl(path, notes) if isinstance(r.get("task_id"), str)]


def _whole_lines(path: Path) -> list[tuple[dict, int]]:
    """Each newline-ended row of a run file and the byte offset just after it. The file is read by
    :func:`read_rows` first, which refuses a line vskip did not write; a last line without its
    newline was cut by a kill and is left out."""
    rows = read_rows(path)
    raw, ends, start = path.read_bytes() if path.exists() else b"", [], 0
    while (end := raw.find(b"\n", start)) >= 0:
        if raw[start:end].strip():
            ends.append(end + 1)
        start = end + 1
    return list(zip(rows, ends))


def resume_state(out: Path) -> tuple[dict[tuple[str, int], dict], list[RoundRow]]:
    """The finished completions of a run directory ((task id, sample) -> sample row) and their
    rounds. Prompts are whole in the order they were written: the sample line after its rounds,
    recording how many it wrote. Both files are truncated after the last whole prompt (a line cut by
    a kill, rounds without their sample, a count that does not add up end the whole ones); what
    follows is redone and appended. A line vskip did not write raises :class:`FileError`. A new run
    directory stays empty (so that a run that fails before its ``config.json`` leaves nothing that
    blocks the next try)."""
    if not (out / SAMPLES).exists() and not (out / ROUNDS).exists():
        return {}, []
    samples, rounds = _whole_lines(out / SAMPLES), _whole_lines(out / ROUNDS)
    done: dict[tuple[str, int], dict] = {}
    kept: list[RoundRow] = []
    s_end = r_end = j = 0
    for row, end in samples:
        key, want, mine = row_key(row), row.get("rounds"), []
        while (j < len(rounds) and row_key(rounds[j][0]) == key
               and (want is None or len(mine) < want)):
            mine.append(rounds[j])
            j += 1
        if want is not None and len(mine) != want:
            print(f"[vskip] {out}: {row['task_id']} has {len(mine)} of its {want} rounds; it is redone",
                  file=sys.stderr)
            break
        done[key] = row
        kept += [RoundRow.from_json(r) for r, _ in mine]
        s_end, r_end = end, (mine[-1][1] if mine else r_end)
    for name, size in ((SAMPLES, s_end), (ROUNDS, r_end)):
        if (out / name).exists() and (out / name).stat().st_size != size:
            os.truncate(out / name, size)
    return done, kept


def append_prompt(out: Path, rounds: Sequence[RoundRow], sample: dict) -> None:
    """Append one finished completion: its rounds, then its sample (which vouches for them: a kill
    in between leaves rounds without a sample, which the resume drops)."""
    append_lines(out / ROUNDS, "".join(json.dumps(r.to_json()) + "\n" for r in rounds))
    append_lines(out / SAMPLES, json.dumps(sample) + "\n")


def append_lines(path: Path, text: str) -> None:
    """Append whole lines and flush them to disk before the next write depends on them."""
    with naming(path), open_append(path) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


# --------------------------------------------------------------------------- reading runs, as reports and
# calibrations do: tolerant of unfinished and damaged runs, which it notes


@dataclass
class Run:
    """One run directory as read, whatever version wrote it."""

    path: Path
    label: str = ""
    config: dict | None = None
    summary: dict | None = None
    samples: list[dict] = field(default_factory=list)
    rounds: list[RoundRow] = field(default_factory=list)
    sweep: dict | None = None
    notes: list[str] = field(default_factory=list)
    #: aggregates over all of the run's prompts, kept by :func:`vskip.report.paired.metrics_of`
    _metrics: object = field(default=None, repr=False)

    @property
    def run_cfg(self) -> dict:
        return (self.config or {}).get("run") or {}

    @property
    def task(self) -> str | None:
        return (self.summary or {}).get("task") or self.run_cfg.get("task")

    @property
    def policy(self) -> str | None:
        s = self.summary or {}
        return s.get("policy") or (self.run_cfg.get("policy") or {}).get("name")

    @property
    def params(self) -> dict:
        """The policy parameters that matter for this method (``PolicyConfig.summary()``)."""
        pol = self.run_cfg.get("policy") or {}
        s = self.summary or {}
        return {k: pol.get(k, s.get(k)) for k in policy_params(self.policy)}

    @property
    def gamma(self) -> int | None:
        return (self.run_cfg.get("decode") or {}).get("gamma") or (self.summary or {}).get("gamma")

    @property
    def ids(self) -> list[str]:
        return [s["task_id"] for s in self.samples if "task_id" in s]

    @property
    def machines(self) -> set[str]:
        """The machines its prompts were timed on (empty for runs that predate the record)."""
        return {s["machine"] for s in self.samples if s.get("machine")}

    @property
    def expected(self) -> int | None:
        """How many prompts the run was asked for, where that is known."""
        if self.sweep and self.sweep.get("selection"):
            return len(self.sweep["selection"])
        rc = self.run_cfg
        if rc.get("ids"):
            n = len(rc["ids"])
            return (min(n, rc["limit"]) if rc.get("limit") else n) * int(rc.get("samples_per_prompt") or 1)
        return None

    def command(self) -> str:
        """The command that produced the run, as recorded: its own, or its sweep's (with the
        configuration's name)."""
        for key in ("command", "argv"):
            c = (self.config or {}).get(key)
            if c:
                return c if isinstance(c, str) else shlex.join(c)
        if self.sweep and self.sweep.get("command"):
            return f"{self.sweep['command']}  # configuration {self.path.name}"
        return "(not recorded)"


def _read_json(path: Path, notes: list[str]) -> dict | None:
    if not path.exists():
        return None
    try:
        d = read_json(path)
    except (FileError, OSError) as e:
        notes.append(f"{path.name} is unreadable ({type(e).__name__})")
        return None
    if not isinstance(d, dict):
        notes.append(f"{path.name} is not a JSON object")
        return None
    return d


def _read_jsonl(path: Path, notes: list[str]) -> list[dict]:
    try:
        return read_jsonl(path, on_cut=notes.append, partial=True)
    except (FileError, OSError) as e:
        notes.append(f"{path.name} is unreadable ({type(e).__name__})")
        return []


def find_run_dirs(paths: Sequence[Path], notes: list[str]) -> list[Path]:
    """Run directories given directly or found below the given directories (shard directories
    of an unfinished sweep are left out: their configuration's directory is the run)."""
    found = []
    for p in map(Path, paths):
        if not p.exists():
            notes.append(f"{p} does not exist")
            continue
        if any((p / f).exists() for f in RUN_FILES):
            found.append(p)
            continue
        below = sorted(d for d in p.rglob("*") if d.is_dir() and any((d / f).exists() for f in RUN_FILES)
                       and "_shards" not in d.relative_to(p).parts)
        if not below:
            notes.append(f"{p} holds no run directories")
        found += below
    seen, out = set(), []
    for d in found:
        if d.resolve() not in seen:
            seen.add(d.resolve())
            out.append(d)
    return out


def load_run(path: Path) -> Run:
    run = Run(Path(path))
    n = run.notes
    run.config = _read_json(path / CONFIG, n)
    run.summary = _read_json(path / SUMMARY, n)
    run.samples = _read_jsonl(path / SAMPLES, n)
    run.rounds = read_rounds(path / ROUNDS, n)
    _completions_as_prompts(run)
    sweep_file = path.parent / SWEEP
    run.sweep = _read_json(sweep_file, n) if sweep_file.exists() else None
    if run.config is None:
        n.append("no config.json: the command is unknown")
    exp = run.expected
    done = f"{len(run.samples)} of {exp}" if exp is not None and len(run.samples) < exp else f"{len(run.samples)}"
    if not run.samples:
        n.append("no samples.jsonl" + ("; metrics from summary.json only" if run.summary else ""))
    elif run.summary is None:
        n.append(f"unfinished: no summary.json; metrics from the {done} prompts done")
    elif exp is not None and len(run.samples) < exp:
        n.append(f"unfinished: {done} prompts")
    if run.samples and not run.rounds:
        n.append("no rounds.jsonl: agreement and A are unknown")
    if len(run.machines) > 1:
        from ..engine.runtime import machine_name

        named = "; ".join(machine_name(m) for m in sorted(run.machines))
        n.append(f"timed on {len(run.machines)} machines ({named}): its tokens/s mixes them")
    if run.task is None:
        n.append("the task is unknown (no summary.json or config.json names it)")
    if run.policy is None:
        n.append("the policy is unknown")
    return run


def _completions_as_prompts(run: Run) -> None:
    """A run of several completions per prompt (``--samples-per-prompt``): each completion is
    compared, paired and bootstrapped as a prompt of its own, ``TASK#SAMPLE`` (sample 0 keeps the
    task's id, so it pairs with a single-completion run), and its pass@1 is the mean over them."""
    for row in run.samples:
        if isinstance(row, dict) and row.get("sample") and "task_id" in row:
            row["task_id"] = f"{row['task_id']}#{int(row['sample'])}"
    run.rounds = [replace(r, task_id=f"{r.task_id}#{int(r.sample)}") if r.sample else r for r in run.rounds]
