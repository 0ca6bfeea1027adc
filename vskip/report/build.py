"""Building the report: grouping runs, comparing them, and writing every table and figure."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ..defaults import K_MIN
from ..engine.policy import SIGNALS
from ..files import own_dir, write_atomic
from ..study.rundir import ARCHIVE, SAMPLES, Run, find_run_dirs, load_run
from .figures import figure1, figure4, figure5, figure_disagreement
from .interpolate import interpolated_table
from .paired import Row, choose_reference, compare, equal_outputs
from .runs import FRONTIER_METHODS, LABELS, PARAMS, _labels
from .tables import (Table, _fmt, _params_str, eq8_table, gate_table, in_main_grid, intervals_table, kmin_families,
                     kmin_table, matched_table, periodic_table, runs_table, table4, timed_table, versus_table)

# --------------------------------------------------------------------------- the report


@dataclass
class Report:
    """What :func:`build_report` wrote: the report's path, the files, and the notes (also in
    ``report.md``)."""

    path: Path
    files: list[str]
    notes: list[str]
    rows: dict  # (task, gamma) -> list[Row]


def _slug(task, gamma) -> str:
    return f"{task}_g{gamma}" if gamma is not None else str(task)


def _details(rows: list[Row], names: Sequence[str]) -> str:
    """The configurations behind a table or figure (their commands are listed once, at the end)."""
    by = {r.name: r for r in rows}
    lines = []
    for n in (n for n in names if n in by):
        params = f" ({_params_str(by[n])})" if by[n].run.params else ""
        lines.append(f"- `{n}`: {LABELS.get(by[n].policy, by[n].policy)}{params}")
    if not lines:
        return ""
    return "<details><summary>configurations</summary>\n\n" + "\n".join(lines) + "\n\n</details>\n"


def _sort_key(row: Row):
    order = {m: i for i, m in enumerate(("ar", "strict") + FRONTIER_METHODS)}
    return (order.get(row.policy, 99), *[-1 if row.p(k) is None else row.p(k) for k in PARAMS], row.name)


def build_report(paths: Sequence[Path], out: Path, k_min: int = K_MIN, n_boot: int = 10_000, seed: int = 0,
                 warn: Callable[[str], None] | None = None, command: str | None = None,
                 timing: Sequence[Path] = (), include_partial: bool = False) -> Report:
    """Read the runs under ``paths`` and write tables, figures and ``report.md`` into ``out``.
    ``command``: the command line that made the report, recorded at its top; ``include_partial``:
    draw runs that hold fewer prompts than the fullest of their group in figures and frontiers."""
    warn = warn or (lambda msg: print(f"vskip report: {msg}", file=sys.stderr))
    notes: list[str] = []
    runs = _read_runs(paths, notes, warn)
    out = own_dir(out)
    md = ["# vskip report", "", "Inputs: " + ", ".join(f"`{p}`" for p in paths), ""]
    if command:
        md += ["Made by:", "", "```", command, "```", ""]
    sweeps = {json.dumps(r.sweep.get("command")): r.sweep for r in runs if r.sweep and r.sweep.get("command")}
    if sweeps:
        md += ["Sweeps:", ""] + [f"- `{s['command']}` (grids: {', '.join(s.get('grids') or [s.get('grid', '?')])})"
                                 for s in sweeps.values()] + [""]
    groups = _compare_all(runs, n_boot, seed, notes)
    doc = _Doc(out, notes, include_partial=include_partial)
    timings = _attach_timings(doc, groups, timing)
    for (task, gamma), rows in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        _group_sections(doc, task, gamma, rows, k_min, n_boot)
    _table4_section(doc, groups, k_min)
    _scheduler_section(doc, groups, n_boot, seed, timings)
    doc.body += ["## Runs and commands", ""]
    for rows in groups.values():
        for r in rows:
            doc.body += [f"- `{r.name}` (`{r.run.path}`):", "", "  ```", f"  {r.run.command()}", "  ```", ""]
    for n in notes:
        warn(n)
    md += ["## What is missing", ""] + ([f"- {n}" for n in notes] or ["Nothing: every run was complete."]) + [""]
    write_atomic(out / "report.md", "\n".join(md + doc.body) + "\n")
    return Report(out / "report.md", ["report.md", *doc.files], notes, groups)


def _read_runs(paths: Sequence[Path], notes: list[str], warn) -> list[Run]:
    """The usable runs under ``paths`` (a task, a method, and samples or a summary)."""
    dirs = find_run_dirs(paths, notes)
    if not dirs:
        for n in notes:
            warn(n)
        raise ValueError("no run directories found in " + ", ".join(map(str, paths)))
    runs = [load_run(d) for d in dirs]
    _labels(runs)
    for r in runs:
        notes += [f"{r.label}: {n}" for n in r.notes]
    usable = [r for r in runs if r.task and r.policy and (r.samples or r.summary)]
    if not usable:
        for n in notes:
            warn(n)
        raise ValueError("no usable run in " + ", ".join(map(str, paths)) + (f" ({notes[0]})" if notes else ""))
    return usable


def _compare_all(usable: list[Run], n_boot: int, seed: int, notes: list[str]) -> dict[tuple, list[Row]]:
    """Every run compared with its Strict SDD reference, grouped by (task, gamma)."""
    strict_runs = [r for r in usable if r.policy == "strict"]
    ar_runs = {r.task: r for r in usable if r.policy == "ar" and r.samples}
    groups: dict[tuple, list[Row]] = {}
    for r in usable:
        ref = choose_reference(r, strict_runs)
        row = _guarded(notes, f"{r.label}: metrics", lambda: compare(r, ref, n_boot, seed))
        if row is None:
            continue
        if r.task in ar_runs and r.samples:
            row.equal_ar = equal_outputs(r, ar_runs[r.task])
        if ref is not None and r.samples:
            row.equal_strict = equal_outputs(r, ref)
        if ref is None:
            notes.append(f"{r.label}: no Strict SDD run of {r.task}: relative metrics, matched quality and the "
                         "bootstrap are not available")
        elif row.common == 0:
            notes.append(f"{r.label}: no prompts in common with its Strict SDD reference {ref.label}")
        elif row.common < max(row.m.n, 1) or (ref.samples and row.common < len(ref.ids)):
            notes.append(f"{r.label}: compared with {ref.label} on the {row.common} prompts both ran")
        if ref is not None and r is not ref and r.machines and ref.machines and r.machines != ref.machines:
            notes.append(f"{r.label}: timed on other machines than its reference {ref.label}: its tokens/s ratio "
                         "compares machines as well as methods")
        if ref is not None and ref.gamma != r.gamma:
            notes.append(f"{r.label}: its reference {ref.label} used gamma {ref.gamma}, not {r.gamma}")
        lost = [k for k in row.m.missing if k not in (SAMPLES,)]
        if lost:
            notes.append(f"{r.label}: missing " + ", ".join(sorted(set(lost))) + " (written by another version?)")
        groups.setdefault((r.task, r.gamma), []).append(row)
    for rows in groups.values():
        _mark_partial(rows, notes)
    return groups


def _prompts(row: Row) -> int:
    return len(row.run.ids) if row.run.samples else row.m.n


def _mark_partial(rows: list[Row], notes: list[str]) -> None:
    """A run holding fewer prompts than the fullest run of its task and gamma is partial: its label
    says so (every table shows it), and figures and frontiers leave it out unless asked for."""
    full = max((_prompts(r) for r in rows), default=0)
    for row in rows:
        n = _prompts(row)
        if n < full:
            row.partial = (n, full)
            notes.append(f"{row.run.label}: partial ({n} of {full} prompts): marked in the tables, left out of "
                         "figures and frontiers (`--include-partial` draws it)")
            row.run.label = f"{row.run.label} (partial: {n} of {full})"


@dataclass
class _Doc:
    """The report's body as it is written: sections, the files behind them, and the notes."""

    out: Path
    notes: list[str]
    body: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    #: draw partial runs in figures and frontiers too
    include_partial: bool = False

    def drawn(self, rows: list[Row]) -> list[Row]:
        """The rows figures and frontiers may use."""
        return rows if self.include_partial else [r for r in rows if r.partial is None]

    def table(self, header: str, table: Table | None, rows: list[Row], names: Sequence[str], text: str = "") -> None:
        if table is None:
            return
        table.write(self.out)
        self.files.extend([f"{table.name}.md", f"{table.name}.csv"])
        self.body.extend([f"### {header}", "", *([text, ""] if text else []), table.markdown(), "",
                          f"Files: `{table.name}.md`, `{table.name}.csv`.", "", _details(rows, names)])

    def guarded(self, what: str, fn: Callable):
        return _guarded(self.notes, what, fn)


def _group_sections(doc: _Doc, task, gamma, rows: list[Row], k_min: int, n_boot: int) -> None:
    """The tables and figures of one task at one gamma."""
    slug, title = _slug(task, gamma), f"{task}, gamma {gamma}"
    rows.sort(key=_sort_key)
    strict = next((r for r in rows if r.policy == "strict" and r.ref is r.run), None)
    doc.body += [f"## {title}", ""]
    if strict is None:
        doc.body += ["No Strict SDD run for this task: relative columns are empty.", ""]
    names = [r.name for r in rows]
    doc.guarded(f"{title}: runs table", lambda: doc.table(
        "All runs", runs_table(f"runs_{slug}", rows), rows, names,
        "Relative columns divide by the Strict SDD run on the prompts both ran; Δpass@1 is a paired "
        f"bootstrap ({n_boot} resamples) over the prompts both scored."))
    doc.guarded(f"{title}: intervals", lambda: doc.table(
        "Intervals", intervals_table(f"intervals_{slug}", rows), rows, names,
        f"Paired percentile bootstrap over prompts ({n_boot} resamples; each replicate resamples the prompts "
        "both runs hold, the same for both). `= ar`: prompts whose generated tokens equal the `ar` run's, "
        "exactly; `= strict`: the same against the Strict SDD run (with a float32 verifier Strict SDD "
        "commits the verifier's own tokens, so this is `= ar` where no `ar` run was made). `discordant`: prompts where the run and Strict SDD differ in pass/fail; `|Δpass@1| ≤` is "
        "the exact (Clopper-Pearson) 95% upper bound on their share, which bounds the pass@1 difference "
        "also where every outcome coincides and the bootstrap interval collapses to [0, 0]: identical "
        "outcomes on n prompts are not evidence of a difference smaller than that bound. `speedup, Eq. 7`: "
        "tokens/s over Strict SDD's with both runs' decode time rebuilt by Eq. 7 from their draft blocks and "
        "verifier calls at Strict SDD's measured c_D and c_V (plus a learned predictor's own seconds): what the "
        "counts imply, free of the machine's drift between runs; it leaves out that a verification after a "
        "skip also reads the skipped tokens, which flatters skipping a little."))
    for fig, fn, caption in (
        ("fig1", figure1, "Strict token agreement vs tokens/s (Figure 1)"),
        ("fig4", figure4, "pass@1 and strict token agreement vs relative verifier calls (Figure 4)"),
        ("figd", figure_disagreement, "Relative calls and Eq. 7 speedup vs disagreement per generated token "
                                      "(beyond the paper)"),
    ):
        doc.guarded(f"{title}: {fig}", lambda fig=fig, fn=fn, caption=caption: _frontier_figure(
            doc, fig, fn, caption, slug, title, doc.drawn(rows), strict, k_min))
    doc.guarded(f"{title}: matched quality", lambda: doc.table(
        "Matched quality (§5.2)", matched_table(f"matched_{slug}", rows, k_min), rows,
        [r.name for r in rows if in_main_grid(r, k_min)],
        "Observed points whose pass@1 equals (=) or is at least (≥) Strict SDD's on the same prompts."))
    _versus_sections(doc, title, slug, doc.drawn(rows), k_min, n_boot)
    doc.guarded(f"{title}: table 2", lambda: doc.table(
        "Gate ablation (Table 2)", gate_table(f"table2_{slug}", rows), rows, [r.name for r in rows if r.policy in SIGNALS]))
    doc.guarded(f"{title}: table 3", lambda: doc.table(
        "Periodic skipping (Table 3)", periodic_table(f"table3_{slug}", rows, k_min), rows,
        [r.name for r in rows if r.policy in ("periodic", "raw")]))
    doc.guarded(f"{title}: repeated timings", lambda: doc.table(
        "Speed timed again (`--timing`)", timed_table(f"timed_{slug}", rows), rows, [r.name for r in rows if r.timed],
        "Runs whose configuration a repeated timing holds: the run's single timing against Strict SDD's "
        "(timed at other moments, so the machine's drift between them enters), Eq. 7 at Strict SDD's costs "
        "(from the counts), and the repeated timing: the configuration decoded beside Strict SDD, prompt by "
        "prompt in a rotating order, several times, on the prompts it timed (a subset of the run's), with "
        "each repeat's ratio. A policy that reads the clock may decide otherwise there than in the run."))
    fams = doc.guarded(f"{title}: k_min families", lambda: kmin_families(doc.drawn(rows))) or []
    for i, fam in enumerate(fams):
        doc.guarded(f"{title}: figure 5", lambda i=i, fam=fam: _kmin_figure(doc, i, fam, slug, title, rows))
    doc.guarded(f"{title}: k_min table", lambda: doc.table(
        "k_min diagnostic (table)", kmin_table(f"kmin_{slug}", fams), rows, [r.name for f in fams for r in f.rows]))
    doc.guarded(f"{title}: Eq. 8", lambda: doc.table(
        "Break-even skip length (Eq. 8)", eq8_table(f"eq8_{slug}", rows), rows, names,
        "Per run: measured c_D (draft seconds per block), c_V (verify seconds per call), Strict SDD's mean "
        "strict commit A, and K* = A c_D / (c_D + c_V)."))


def _versus_sections(doc: _Doc, title: str, slug: str, rows: list[Row], k_min: int, n_boot: int) -> None:
    """The learned signals and the prefix scheduler against raw confidence: at its observed points,
    and against its frontier read between its settings."""
    for policy, what in (("marginal", "Marginal survival against raw confidence (H1)"),
                         ("conditional", "Conditional survival against raw confidence (H1)"),
                         ("prefix", "Prefix scheduler against raw confidence (beyond the paper)")):
        doc.guarded(f"{title}: {policy} vs raw", lambda policy=policy, what=what: doc.table(
            what, versus_table(f"{policy}_vs_raw_{slug}", rows, k_min, policy=policy, n_boot=n_boot),
            rows, [r.name for r in rows if r.policy in (policy, "raw")],
            f"Each {LABELS[policy].lower()} run (main grid) against the raw-confidence runs (main grid) whose "
            "StrictToken is at least its own: the one with the fewest relative calls and the fastest one, and the "
            f"run's calls per token and tokens/s over theirs on the prompts both ran, with paired percentile "
            f"bootstrap intervals ({n_boot} resamples). A ratio whose interval holds 1 is unresolved. Observed "
            "points only. The tokens/s interval covers the choice of prompts, not the machine's drift between "
            "two runs timed at different moments: a speed verdict from one timing of each run is weaker than "
            "the calls verdict. `Eq. 7` sets the run against the raw run fastest under Eq. 7 at Strict SDD's "
            "costs (see Intervals), which drift does not touch."))
    doc.guarded(f"{title}: prefix vs raw by disagreement", lambda: doc.table(
        "Prefix scheduler against raw confidence at equal disagreement (beyond the paper)",
        versus_table(f"prefix_vs_raw_disagreement_{slug}", rows, k_min, policy="prefix", n_boot=n_boot,
                     axis="disagreement"),
        rows, [r.name for r in rows if r.policy in ("prefix", "raw")],
        "As above, with agreement measured per generated token instead of per skipped token: `disagreement` "
        "is the share of a prompt's generated tokens committed beyond the shadow verifier's L, averaged over "
        "prompts (what the prefix scheduler's alpha bounds), and the raw runs set against each prefix run are "
        "those that disagree at most as much. StrictToken (Eq. 1) divides by the tokens skipped, so a policy "
        "that skips more tokens at the same precision keeps its StrictToken while its output departs further "
        "from Strict SDD's; the two axes can rank the same runs differently."))
    for policy, axis, label, what in (
            ("marginal", "strict_token", "StrictToken", "Marginal survival against raw confidence's frontier (H1)"),
            ("conditional", "strict_token", "StrictToken",
             "Conditional survival against raw confidence's frontier (H1)"),
            ("prefix", "strict_token", "StrictToken",
             "Prefix scheduler against raw confidence's frontier at equal StrictToken (beyond the paper)"),
            ("prefix", "disagreement", "disagreement",
             "Prefix scheduler against raw confidence's frontier at equal disagreement (beyond the paper)")):
        doc.guarded(f"{title}: {policy} vs raw's frontier, {label}", lambda policy=policy, axis=axis, label=label,
                    what=what: doc.table(
            what, interpolated_table(f"{policy}_vs_raw_frontier_{axis}_{slug}", rows, k_min, policy=policy, axis=axis,
                                     n_boot=n_boot),
            rows, [r.name for r in rows if r.policy in (policy, "raw")],
            f"Raw confidence's frontier (its Pareto points of {label} and relative calls, main grid, and for speed "
            f"those of {label} and Eq. 7 speedup at Strict SDD's costs) read by a straight line between neighbouring "
            f"settings at each {LABELS[policy].lower()} run's own {label}, and that run's relative calls and Eq. 7 "
            "speedup over the frontier's there. Strict SDD is raw confidence's limit (a threshold of 1 never skips) "
            "and closes the frontier; `read between` names the two settings of the reading. Inside that range "
            "only. Paired percentile bootstrap over prompts that resamples every run at once "
            f"and rebuilds the frontier in each replicate ({n_boot} resamples; `replicates inside the range`: the "
            "share of them in which the run's agreement fell inside raw's range, the interval being over those). "
            "The straight line between two settings is an assumption of the reading."))


def _frontier_figure(doc: _Doc, fig, fn, caption, slug, title, rows, strict, k_min) -> None:
    p = doc.out / f"{fig}_{slug}.png"
    names = fn(p, title, rows, strict, k_min)
    if not names:
        doc.notes.append(f"{title}: {caption}: nothing to draw")
        return
    doc.files.append(p.name)
    doc.body.extend([f"### {caption}", "",
                     f"Each method's Pareto frontier over its grid (signals at k_min={k_min}); faded "
                     "markers are settings dominated by another setting of the same method.", "",
                     f"![{caption}]({p.name})", "", _details(rows, names)])


def _kmin_figure(doc: _Doc, i: int, fam, slug, title, rows) -> None:
    p = doc.out / f"fig5_{slug}_{i}.png"
    ftitle = f"{title}, {fam.policy} eta_b={fam.key[0]:g} eta_c={fam.key[1]:g} s_max={fam.key[2]}"
    figure5(p, ftitle, fam)
    doc.files.append(p.name)
    verdict = {True: "agrees", False: "does not agree", None: "cannot be checked"}[fam.agrees]
    doc.body.extend([f"### k_min diagnostic (Figure 5): {ftitle}", "", f"![Figure 5]({p.name})", "",
                     f"Eq. 8 with Strict SDD's measured c_D, c_V and A gives K* = {_fmt(fam.K_star)}; the "
                     f"smallest k_min above it (k_min 0 acting as 1) is {_fmt(fam.predicted)}, the best observed (highest tokens/s) "
                     f"is {_fmt(fam.best)}: the prediction {verdict}"
                     + (f"; the best k_min lies {'above' if fam.above else 'at or below'} K*."
                        if fam.above is not None else ".")
                     + (f" By Eq. 7 at Strict SDD's costs, from the runs' blocks and calls and free of the drift "
                        f"between their timings, the best is {_fmt(fam.best_eq7)}: the prediction "
                        f"{ {True: 'agrees', False: 'does not agree'}[fam.agrees_eq7] }."
                        if fam.agrees_eq7 is not None else "")
                     + (f" By the repeated timing (`--timing`), the fastest is k_min {_fmt(fam.best_timed)}, "
                        + ("its interval above every other k_min's ratio" if fam.best_timed_resolved else
                           "not resolved from the others (its interval reaches another k_min's ratio)")
                        + f": the prediction { {True: 'agrees', False: 'does not agree'}[fam.agrees_timed] }."
                        if fam.agrees_timed is not None else ""), "",
                     _details(rows, [r.name for r in fam.rows])])


def _table4_section(doc: _Doc, groups, k_min: int) -> None:
    t4 = doc.guarded("table 4", lambda: table4(groups, k_min))
    if not t4:
        return
    table, t4_notes = t4
    doc.notes += t4_notes
    if table is not None:
        table.write(doc.out)
        doc.files.extend(["table4.md", "table4.csv"])
        doc.body += ["## Across tasks (Table 4)", "", table.markdown(), "", "Files: `table4.md`, `table4.csv`.", ""]


def _attach_timings(doc: _Doc, groups: dict, timing: Sequence[Path]) -> list:
    """Read the comparison directories of ``--timing`` and give every row the repeated timing of
    its configuration, where one of them holds it."""
    from .timing import load_timings, timed_fields

    if not timing:
        return []
    timings = doc.guarded("repeated timings", lambda: load_timings(timing)) or []
    for rows in groups.values():
        for r in rows:
            r.timed = doc.guarded(f"repeated timing of {r.name}", lambda r=r: timed_fields([r.run.run_cfg], timings)) or {}
    return timings


def _scheduler_section(doc: _Doc, groups: dict, n_boot: int, seed: int, timings: Sequence = ()) -> None:
    """The promised agreement of ``--policy prefix --alpha`` runs (beyond the paper), also as
    ``scheduler.json``; with ``timings`` (:func:`_attach_timings`), each run's repeated timing too."""
    from .scheduler import FIELDS, pooled_entries, scheduler_entries

    entries = doc.guarded("promised agreement", lambda: [e for rows in groups.values()
                                                         for e in scheduler_entries(rows, n_boot, seed)]) or []
    entries += doc.guarded("promised agreement, tasks pooled", lambda: pooled_entries(
        [r for rows in groups.values() for r in rows], n_boot, seed, timings)) or []
    if not entries:
        return
    write_atomic(doc.out / "scheduler.json", json.dumps(entries, indent=1) + "\n")
    doc.files.append("scheduler.json")
    t = Table("scheduler", list(FIELDS), [[e[k] if not isinstance(e[k], (list, tuple)) else
                                           f"[{e[k][0]:.4f}, {e[k][1]:.4f}]" for k in FIELDS] for e in entries])
    t.write(doc.out)
    doc.files += ["scheduler.md", "scheduler.csv"]
    doc.body += ["## Promised agreement of the prefix scheduler (beyond the paper)", "",
                 "Per `--policy prefix --alpha A` run: the realised disagreement (drafted tokens committed beyond "
                 "the shadow verifier's L, over generated tokens, averaged over prompts) with a percentile "
                 f"bootstrap over prompts ({n_boot} resamples), against the promise alpha; verifier calls per token "
                 "and tokens/s relative to Strict SDD on the same prompts (paired bootstrap). The quantity is the "
                 "disagreement with the verifier in the run's own context. A model calibrated online on it "
                 "(`vskip calibrate-online`) promises its mean in expectation over new prompts exchangeable with "
                 "the calibration prompts; a model calibrated on traces bounds only the loss replayed on the "
                 "calibration's blocks, so against it this column is an observation, not a guarantee kept or "
                 "broken. `verdict`: `within` where the "
                 "realised mean is at most alpha, `exceeded` where its whole interval lies above alpha, `above, "
                 "unresolved` between. A configuration run on several tasks with the same predictor also gets a row "
                 "over their prompts together (`task` joined by +): where the model was calibrated on those tasks "
                 "pooled, that is the population the promise is about, and one task alone is not covered by it. "
                 "`predictor`: the model the run read (an on-policy round's beside round 0). "
                 "`skips`, `wrong_skip_share`, `mean_skip`: the skipped rounds, the share of them that commits a "
                 "token beyond L, and their mean length. `tokens_per_s_ratio` is the run's single timing against "
                 "Strict SDD's, taken at another moment; `timed_tokens_per_s_ratio`, where the report was given "
                 "`--timing`, is the same configuration timed again beside Strict SDD (interleaved, repeated, "
                 "paired per prompt) on the `timed_prompts` that comparison decoded.", "",
                 t.markdown(), "", "Files: `scheduler.json`, `scheduler.md`, `scheduler.csv`.", ""]


def _guarded(notes: list[str], what: str, fn: Callable):
    """Run one part of the report; a failure becomes a note, and the rest is still produced."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the report must never stop on one bad input
        notes.append(f"{what}: could not be produced ({type(e).__name__}: {e})")
        return None


# --------------------------------------------------------------------------- command line


#: the run files kept by ``--archive`` (traces are left out: they are large and rebuilt by a rerun)
ARCHIVED = ("config.json", "samples.jsonl", "rounds.jsonl", "summary.json")


def archive_runs(rep: Report, path: Path) -> Path:
    """The run files behind ``rep`` as one deterministic ``.tar.xz`` (sorted, no times or owners):
    the same runs always give the same bytes. Each run keeps its path as the report named it, with
    its sweep's ``sweep.json``."""
    import io
    import lzma
    import tarfile

    from ..files import write_atomic

    members: dict[str, Path] = {}
    for rows in rep.rows.values():
        for r in rows:
            base = Path(r.run.path)
            for name in ARCHIVED:
                if (base / name).exists():
                    members[(base / name).as_posix().lstrip("/")] = base / name
            if (base.parent / "sweep.json").exists():
                members[(base.parent / "sweep.json").as_posix().lstrip("/")] = base.parent / "sweep.json"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arcname in sorted(members):
            data = members[arcname].read_bytes()
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return write_atomic(path, lzma.compress(buf.getvalue(), preset=9))
