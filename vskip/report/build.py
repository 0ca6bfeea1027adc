"""Building the report: grouping runs, comparing them, and writing every table and figure."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..policy import SIGNALS
from .compare import Row, choose_reference, compare, equal_outputs
from .figures import figure1, figure4, figure5
from .runs import FRONTIER_METHODS, LABELS, PARAMS, SAMPLES, _labels, find_run_dirs, load_run
from .tables import (Table, _fmt, _params_str, eq8_table, gate_table, in_main_grid, intervals_table, kmin_families,
                     kmin_table, matched_table, periodic_table, runs_table, table4)


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
        lines.append(f"- `{n}`: {LABELS.get(by[n].method, by[n].method)}{params}")
    if not lines:
        return ""
    return "<details><summary>configurations</summary>\n\n" + "\n".join(lines) + "\n\n</details>\n"


def _sort_key(row: Row):
    order = {m: i for i, m in enumerate(("ar", "strict") + FRONTIER_METHODS)}
    return (order.get(row.method, 99), *[-1 if row.p(k) is None else row.p(k) for k in PARAMS], row.name)


def build_report(paths: Sequence[Path], out: Path, k_min: int = 6, n_boot: int = 10_000, seed: int = 0,
                 warn: Callable[[str], None] | None = None) -> Report:
    """Read the runs under ``paths`` and write tables, figures and ``report.md`` into ``out``."""
    warn = warn or (lambda msg: print(f"vskip report: {msg}", file=sys.stderr))
    notes: list[str] = []
    dirs = find_run_dirs(paths, notes)
    if not dirs:
        for n in notes:
            warn(n)
        raise ValueError("no run directories found in " + ", ".join(map(str, paths)))
    runs = [load_run(d) for d in dirs]
    _labels(runs)
    for r in runs:
        notes += [f"{r.label}: {n}" for n in r.notes]
    usable = [r for r in runs if r.task and r.method and (r.samples or r.summary)]
    if not usable:
        for n in notes:
            warn(n)
        raise ValueError("no usable run in " + ", ".join(map(str, paths)) + (f" ({notes[0]})" if notes else ""))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files: list[str] = []
    md = ["# vskip report", "", "Inputs: " + ", ".join(f"`{p}`" for p in paths), ""]
    sweeps = {json.dumps(r.sweep.get("command")): r.sweep for r in runs if r.sweep and r.sweep.get("command")}
    if sweeps:
        md += ["Sweeps:", ""] + [f"- `{s['command']}` (grids: {', '.join(s.get('grids') or [s.get('grid', '?')])})"
                                 for s in sweeps.values()] + [""]

    strict_runs = [r for r in usable if r.method == "strict"]
    ar_runs = {r.task: r for r in usable if r.method == "ar" and r.samples}
    groups: dict[tuple, list[Row]] = {}
    for r in usable:
        ref = choose_reference(r, strict_runs)
        row = _guarded(notes, f"{r.label}: metrics", lambda: compare(r, ref, n_boot, seed))
        if row is None:
            continue
        if r.task in ar_runs and r.samples:
            row.equal_ar = equal_outputs(r, ar_runs[r.task])
        if ref is None:
            notes.append(f"{r.label}: no Strict SDD run of {r.task}: relative metrics, matched quality and the "
                         "bootstrap are not available")
        elif row.common == 0:
            notes.append(f"{r.label}: no prompts in common with its Strict SDD reference {ref.label}")
        elif row.common < max(row.m.n, 1) or (ref.samples and row.common < len(ref.ids)):
            notes.append(f"{r.label}: compared with {ref.label} on the {row.common} prompts both ran")
        if ref is not None and ref.gamma != r.gamma:
            notes.append(f"{r.label}: its reference {ref.label} used gamma {ref.gamma}, not {r.gamma}")
        lost = [k for k in row.m.missing if k not in (SAMPLES,)]
        if lost:
            notes.append(f"{r.label}: missing " + ", ".join(sorted(set(lost))) + " (written by another version?)")
        groups.setdefault((r.task, r.gamma), []).append(row)

    body: list[str] = []
    for (task, gamma), rows in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        slug = _slug(task, gamma)
        title = f"{task}, gamma {gamma}"
        rows.sort(key=_sort_key)
        strict = next((r for r in rows if r.method == "strict" and r.ref is r.run), None)
        body += [f"## {title}", ""]
        if strict is None:
            body += ["No Strict SDD run for this task: relative columns are empty.", ""]

        def section(header: str, table: Table | None, names: Sequence[str], text: str = ""):
            if table is None:
                return
            table.write(out)
            files.extend([f"{table.name}.md", f"{table.name}.csv"])
            body.extend([f"### {header}", "", *([text, ""] if text else []), table.markdown(), "",
                         f"Files: `{table.name}.md`, `{table.name}.csv`.", "", _details(rows, names)])

        _guarded(notes, f"{title}: runs table", lambda: section(
            "All runs", runs_table(f"runs_{slug}", rows), [r.name for r in rows],
            "Relative columns divide by the Strict SDD run on the prompts both ran; Δpass@1 is a paired "
            f"bootstrap ({n_boot} resamples) over the prompts both scored."))
        _guarded(notes, f"{title}: intervals", lambda: section(
            "Intervals", intervals_table(f"intervals_{slug}", rows), [r.name for r in rows],
            f"Paired percentile bootstrap over prompts ({n_boot} resamples; each replicate resamples the prompts "
            "both runs hold, the same for both). `= ar`: prompts whose generated tokens equal the `ar` run's, "
            "exactly. `discordant`: prompts where the run and Strict SDD differ in pass/fail; `|Δpass@1| ≤` is "
            "the exact (Clopper-Pearson) 95% upper bound on their share, which bounds the pass@1 difference "
            "also where every outcome coincides and the bootstrap interval collapses to [0, 0]: identical "
            "outcomes on n prompts are not evidence of a difference smaller than that bound."))

        for fig, fn, caption in (
            ("fig1", figure1, "Strict token agreement vs tokens/s (Figure 1)"),
            ("fig4", figure4, "pass@1 and strict token agreement vs relative verifier calls (Figure 4)"),
        ):
            def draw(fig=fig, fn=fn, caption=caption):
                p = out / f"{fig}_{slug}.png"
                names = fn(p, title, rows, strict, k_min)
                if not names:
                    notes.append(f"{title}: {caption}: nothing to draw")
                    return
                files.append(p.name)
                body.extend([f"### {caption}", "",
                             f"Each method's Pareto frontier over its grid (signals at k_min={k_min}); faded "
                             "markers are settings dominated by another setting of the same method.", "",
                             f"![{caption}]({p.name})", "", _details(rows, names)])
            _guarded(notes, f"{title}: {fig}", draw)

        _guarded(notes, f"{title}: matched quality", lambda: section(
            "Matched quality (§5.2)", matched_table(f"matched_{slug}", rows, k_min),
            [r.name for r in rows if in_main_grid(r, k_min)],
            "Observed points whose pass@1 equals (=) or is at least (≥) Strict SDD's on the same prompts."))
        _guarded(notes, f"{title}: table 2", lambda: section(
            "Gate ablation (Table 2)", gate_table(f"table2_{slug}", rows),
            [r.name for r in rows if r.method in SIGNALS]))
        _guarded(notes, f"{title}: table 3", lambda: section(
            "Periodic skipping (Table 3)", periodic_table(f"table3_{slug}", rows, k_min),
            [r.name for r in rows if r.method in ("periodic", "raw")]))

        fams = _guarded(notes, f"{title}: k_min families", lambda: kmin_families(rows)) or []
        for i, fam in enumerate(fams):
            def draw5(i=i, fam=fam):
                p = out / f"fig5_{slug}_{i}.png"
                ftitle = f"{title}, {fam.method} eta_b={fam.key[0]:g} eta_c={fam.key[1]:g} s_max={fam.key[2]}"
                figure5(p, ftitle, fam)
                files.append(p.name)
                verdict = {True: "agrees", False: "does not agree", None: "cannot be checked"}[fam.agrees]
                body.extend([f"### k_min diagnostic (Figure 5): {ftitle}", "", f"![Figure 5]({p.name})", "",
                             f"Eq. 8 with Strict SDD's measured c_D, c_V and A gives K* = {_fmt(fam.K_star)}; the "
                             f"smallest k_min above it (k_min 0 acting as 1) is {_fmt(fam.predicted)}, the best observed (highest tokens/s) "
                             f"is {_fmt(fam.best)}: the prediction {verdict}"
                             + (f"; the best k_min lies {'above' if fam.above else 'at or below'} K*."
                                if fam.above is not None else "."), "",
                             _details(rows, [r.name for r in fam.rows])])
            _guarded(notes, f"{title}: figure 5", draw5)
        _guarded(notes, f"{title}: k_min table", lambda: section(
            "k_min diagnostic (table)", kmin_table(f"kmin_{slug}", fams), [r.name for f in fams for r in f.rows]))
        _guarded(notes, f"{title}: Eq. 8", lambda: section(
            "Break-even skip length (Eq. 8)", eq8_table(f"eq8_{slug}", rows), [r.name for r in rows],
            "Per run: measured c_D (draft seconds per block), c_V (verify seconds per call), Strict SDD's mean "
            "strict commit A, and K* = A c_D / (c_D + c_V)."))

    t4 = _guarded(notes, "table 4", lambda: table4(groups, k_min))
    if t4:
        table, t4_notes = t4
        notes += t4_notes
        if table is not None:
            table.write(out)
            files.extend(["table4.md", "table4.csv"])
            body += ["## Across tasks (Table 4)", "", table.markdown(), "", "Files: `table4.md`, `table4.csv`.", ""]

    body += ["## Runs and commands", ""]
    for rows in groups.values():
        for r in rows:
            body += [f"- `{r.name}` (`{r.run.path}`):", "", "  ```", f"  {r.run.command()}", "  ```", ""]
    for n in notes:
        warn(n)
    md += ["## What is missing", ""] + ([f"- {n}" for n in notes] or ["Nothing: every run was complete."]) + [""]
    md += body
    (out / "report.md").write_text("\n".join(md) + "\n")
    return Report(out / "report.md", ["report.md", *files], notes, groups)


def _guarded(notes: list[str], what: str, fn: Callable):
    """Run one part of the report; a failure becomes a note, and the rest is still produced."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the report must never stop on one bad input
        notes.append(f"{what}: could not be produced ({type(e).__name__}: {e})")
        return None


# --------------------------------------------------------------------------- command line


def cmd_report(a) -> int:
    if a.bootstrap < 1:
        raise ValueError(f"--bootstrap must be >= 1, got {a.bootstrap}")
    rep = build_report([Path(p) for p in a.dirs], Path(a.out), k_min=a.k_min, n_boot=a.bootstrap, seed=a.seed)
    print(json.dumps({"report": str(rep.path), "files": len(rep.files), "notes": len(rep.notes)}))
    return 0
