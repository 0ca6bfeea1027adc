"""``vskip report``: frontiers, tables and figures of the paper from run directories, no model.

Reads run directories (or sweep directories holding them) and writes, under ``--out``:

- ``runs_<group>.{md,csv}``: every run against the Strict SDD run of the same task and prompts
  (relative verifier calls and draft blocks per generated token, tokens/s, pass@1 with a paired
  bootstrap interval of its difference, StrictToken Eq. 1, FullPrefix Eq. 2, skipped rounds);
- ``fig1_<group>.png`` (strict token agreement vs tokens/s) and ``fig4_<group>.png`` (pass@1 and
  agreement vs relative calls): each method's Pareto frontier over its grid, dominated settings
  faded;
- ``fig5_<group>_<n>.png`` and ``kmin_<group>.{md,csv}``: the ``k_min`` diagnostic, with the
  break-even length ``K*`` of Eq. 8 from measured ``c_D``, ``c_V`` and Strict SDD's ``A``;
- ``eq8_<group>.{md,csv}``, ``table2_<group>``, ``table3_<group>``, ``matched_<group>`` (§5.2) and
  ``table4`` (all tasks);
- ``report.md`` laying them out with the configuration and command behind each.

A group is one task at one ``gamma``. What cannot be produced (missing files or fields, unfinished
runs, no Strict SDD reference) is said in ``report.md`` and on stderr; the rest is still written.
"""

from __future__ import annotations

import csv
import json
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .metrics import agreement_from_rounds
from .policy import DEFAULT_GATES, SIGNALS, break_even_length

from .rundir import CONFIG, ROUNDS, SAMPLES, SUMMARY, SWEEP  # noqa: E402
RUN_FILES = (SAMPLES, SUMMARY, CONFIG)
LABELS = {
    "ar": "AR (verifier alone)", "strict": "Strict SDD", "lenience": "Lenience", "topk": "Top-k",
    "periodic": "Periodic", "raw": "Raw confidence", "marginal": "Marginal survival",
    "conditional": "Conditional survival",
}
#: Methods drawn as frontiers (Figures 1 and 4), in legend order.
FRONTIER_METHODS = ("raw", "marginal", "conditional", "lenience", "topk", "periodic")
COLORS = {"raw": "C0", "marginal": "C1", "conditional": "C2", "lenience": "C3", "topk": "C4", "periodic": "C5"}
PARAMS = ("eta_b", "eta_c", "k_min", "s_max", "lenience", "top_k", "period", "period_k")
TIMING_FIELDS = ("decode_seconds", "draft_seconds", "verify_seconds")


# --------------------------------------------------------------------------- reading runs


@dataclass
class Run:
    """One run directory as read, whatever version wrote it."""

    path: Path
    label: str = ""
    config: dict | None = None
    summary: dict | None = None
    samples: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    sweep: dict | None = None
    notes: list[str] = field(default_factory=list)
    _metrics: "Metrics | None" = field(default=None, repr=False)

    def metrics(self) -> "Metrics":
        """Aggregates over all of the run's prompts (computed once)."""
        if self._metrics is None:
            self._metrics = compute_metrics(self)
        return self._metrics

    @property
    def run_cfg(self) -> dict:
        return (self.config or {}).get("run") or {}

    @property
    def task(self) -> str | None:
        return (self.summary or {}).get("task") or self.run_cfg.get("task")

    @property
    def method(self) -> str | None:
        s = self.summary or {}
        return s.get("policy") or (self.run_cfg.get("policy") or {}).get("name")

    @property
    def params(self) -> dict:
        """The policy parameters that matter for this method (``PolicyConfig.summary()``)."""
        pol = self.run_cfg.get("policy") or {}
        s = self.summary or {}
        m = self.method
        keys = {"lenience": ("lenience",), "topk": ("top_k",), "periodic": ("period", "period_k", "s_max")}.get(
            m, ("eta_b", "eta_c", "k_min", "s_max") if m in SIGNALS else ())
        return {k: pol.get(k, s.get(k)) for k in keys}

    @property
    def gamma(self) -> int | None:
        return (self.run_cfg.get("decode") or {}).get("gamma") or (self.summary or {}).get("gamma")

    @property
    def ids(self) -> list[str]:
        return [s["task_id"] for s in self.samples if "task_id" in s]

    @property
    def expected(self) -> int | None:
        """How many prompts the run was asked for, where that is known."""
        if self.sweep and self.sweep.get("selection"):
            return len(self.sweep["selection"])
        rc = self.run_cfg
        if rc.get("ids"):
            n = len(rc["ids"])
            return min(n, rc["limit"]) if rc.get("limit") else n
        return None

    def command(self) -> str:
        """The command that produced the run: recorded if the writer kept one, else rebuilt
        from ``config.json``."""
        for key in ("command", "argv"):
            c = (self.config or {}).get(key)
            if c:
                return c if isinstance(c, str) else shlex.join(c)
        return rebuild_command(self.run_cfg, self.path) if self.run_cfg else "(no config.json)"


def rebuild_command(rc: dict, out: Path) -> str:
    """``vskip run`` flags equivalent to a run configuration as written in ``config.json``."""
    pol, dec, mod = rc.get("policy") or {}, rc.get("decode") or {}, rc.get("models") or {}
    name = pol.get("name", "?")
    a = ["vskip", "run", "--task", str(rc.get("task")), "--policy", name]
    flags = {"lenience": ("lenience",), "topk": ("top_k",), "periodic": ("period", "period_k", "s_max")}.get(
        name, ("eta_b", "eta_c", "k_min", "s_max") if name in SIGNALS else ())
    for k in flags:
        if pol.get(k) is not None:
            a += [f"--{k.replace('_', '-')}", f"{pol[k]:g}" if isinstance(pol[k], float) else str(pol[k])]
    for k in ("gamma", "max_new_tokens"):
        if dec.get(k) is not None:
            a += [f"--{k.replace('_', '-')}", str(dec[k])]
    if dec.get("shadow") is False:
        a.append("--no-shadow")
    for k in ("steps", "drafter", "verifier", "reveal", "device", "dtype", "threads"):
        if mod.get(k) is not None and not (k == "steps" and mod[k] == 2):
            a += [f"--{k}", str(mod[k])]
    if mod.get("verifier_cache") is False:
        a.append("--no-verifier-cache")
    if rc.get("predictor"):
        a += ["--predictor", str(rc["predictor"])]
    if rc.get("limit") is not None:
        a += ["--limit", str(rc["limit"])]
    if rc.get("ids"):
        a += ["--ids", ",".join(rc["ids"])]
    if rc.get("score") is False:
        a.append("--no-score")
    return shlex.join(a + ["--out", str(out)])


def _read_json(path: Path, notes: list[str]) -> dict | None:
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, OSError, UnicodeDecodeError) as e:
        notes.append(f"{path.name} is unreadable ({type(e).__name__})")
        return None
    if not isinstance(d, dict):
        notes.append(f"{path.name} is not a JSON object")
        return None
    return d


def _read_jsonl(path: Path, notes: list[str]) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        notes.append(f"{path.name} is unreadable ({type(e).__name__})")
        return []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            notes.append(f"{path.name}: line {i + 1} is cut or invalid; read the {len(rows)} lines before it")
            break
        if isinstance(r, dict):
            rows.append(r)
    return rows


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
    run.rounds = _read_jsonl(path / ROUNDS, n)
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
    if run.task is None:
        n.append("the task is unknown (no summary.json or config.json names it)")
    if run.method is None:
        n.append("the policy is unknown")
    return run


def _labels(runs: list[Run]) -> None:
    """Each run's display name: its directory name, or parent/name where names repeat."""
    names = [r.path.name for r in runs]
    for r in runs:
        r.label = r.path.name if names.count(r.path.name) == 1 else f"{r.path.parent.name}/{r.path.name}"


# --------------------------------------------------------------------------- metrics


@dataclass
class Metrics:
    """One run's aggregates over a set of prompts (None: unknown from what was written)."""

    n: int
    tokens: float | None
    seconds: float | None
    tokens_per_s: float | None
    calls_per_token: float | None
    blocks_per_token: float | None
    pass_at_1: float | None
    passed: dict  # task_id -> bool, scored prompts only
    strict_token: float | None
    full_prefix: float | None
    skipped_rounds: int | None
    c_D: float | None
    c_V: float | None
    A: float | None
    missing: list[str]


def _total(samples: list[dict], key: str, missing: list[str]):
    vals = [s.get(key) for s in samples]
    if any(v is None for v in vals):
        missing.append(key)
        return None
    return sum(vals)


def _div(a, b):
    return a / b if a is not None and b else None


def _agreement(rounds: list[dict], method: str | None, missing: list[str]):
    """StrictToken and FullPrefix (Eqs. 1-2); rounds of writers without ``relaxed`` or
    ``accepted`` fall back to the DESIGN §8 fields (a skipped round is relaxed, K its length)."""
    if method in ("strict", "ar"):
        return 1.0, 1.0
    if not rounds:
        return None, None
    if all("relaxed" in r and "accepted" in r and "verified" in r for r in rounds):
        lacking = sum(1 for r in rounds if r["relaxed"] and r.get("L") is None)
        if lacking:
            missing.append(f"L on {lacking} relaxed rounds (no shadow verifier)")
        st, fp, n = agreement_from_rounds(rounds)
        return (st, fp) if n or not lacking else (None, None)
    if method in ("lenience", "topk"):
        missing.append("relaxed/accepted round fields")
        return None, None
    missing.append("relaxed/accepted round fields (agreement from skipped rounds)")
    pairs = [(r.get("K") or 0, r.get("L")) for r in rounds if r.get("verified") is False]
    pairs = [(k, l) for k, l in pairs if k > 0 and l is not None]
    if not pairs:
        return 1.0, 1.0
    return (sum(min(k, l) for k, l in pairs) / sum(k for k, _ in pairs),
            sum(k <= l for k, l in pairs) / len(pairs))


def compute_metrics(run: Run, ids: set[str] | None = None) -> Metrics:
    """Aggregates over the run's prompts, or over ``ids`` only (for comparisons on the prompts
    two runs share). ΣN/ΣT throughput; calls and blocks per generated token (§5.1, A.8)."""
    missing: list[str] = []
    if not run.samples and run.summary:
        s = run.summary
        return Metrics(s.get("n_prompts") or 0, s.get("generated_tokens"), s.get("decode_seconds"),
                       s.get("tokens_per_s"), s.get("calls_per_token"), s.get("blocks_per_token"),
                       s.get("pass_at_1"), {}, s.get("strict_token"), s.get("full_prefix"),
                       s.get("skipped_rounds"), s.get("c_D"), s.get("c_V"), s.get("A"), [SAMPLES])
    samples = [s for s in run.samples if ids is None or s.get("task_id") in ids]
    keep = {s.get("task_id") for s in samples}
    rounds = [r for r in run.rounds if r.get("task_id") in keep]
    N = _total(samples, "generated_tokens", missing)
    T = _total(samples, "decode_seconds", missing)
    calls = _total(samples, "verifier_calls", missing)
    blocks = _total(samples, "draft_blocks", missing)
    skipped = _total(samples, "skipped_rounds", missing)
    draft_s = _total(samples, "draft_seconds", missing)
    verify_s = _total(samples, "verify_seconds", missing)
    passed = {s["task_id"]: bool(s["passed"]) for s in samples if s.get("passed") is not None and "task_id" in s}
    st, fp = _agreement(rounds, run.method, missing)
    verified = [r for r in rounds if r.get("verified") and (r.get("gamma") is None or r.get("gamma", 0) > 0)]
    commits = [r["committed"] for r in verified if r.get("committed") is not None]
    return Metrics(
        n=len(samples), tokens=N, seconds=T, tokens_per_s=_div(N, T),
        calls_per_token=_div(calls, N), blocks_per_token=_div(blocks, N),
        pass_at_1=(sum(passed.values()) / len(passed)) if passed else None, passed=passed,
        strict_token=st, full_prefix=fp, skipped_rounds=skipped,
        c_D=_div(draft_s, blocks), c_V=_div(verify_s, calls),
        A=(sum(commits) / len(commits)) if commits else None, missing=missing,
    )


@dataclass
class Row:
    """One run in its group: its own metrics, and comparisons with its Strict SDD reference on
    the prompts both ran."""

    run: Run
    m: Metrics
    ref: Run | None = None
    common: int = 0
    rel_calls: float | None = None
    rel_blocks: float | None = None
    speedup: float | None = None
    pass_common: float | None = None
    ref_pass_common: float | None = None
    tps_common: float | None = None
    ref_tps_common: float | None = None
    delta: float | None = None
    ci: tuple[float, float] | None = None
    A: float | None = None
    K_star: float | None = None

    @property
    def name(self) -> str:
        return self.run.label

    @property
    def method(self) -> str | None:
        return self.run.method

    def p(self, key):
        return self.run.params.get(key)


def choose_reference(run: Run, strict_runs: list[Run]) -> Run | None:
    """The Strict SDD run of the same task, preferring the same gamma, then the most prompts in
    common with ``run``."""
    if run.method == "strict":
        return run
    same = [s for s in strict_runs if s.task == run.task]
    if not same:
        return None
    ids = set(run.ids)
    return max(same, key=lambda s: (s.gamma == run.gamma, len(ids & set(s.ids)), len(s.ids)))


def _ratio(a, b):
    return a / b if a is not None and b else None


def compare(run: Run, ref: Run | None, n_boot: int, seed: int) -> Row:
    from .scoring import paired_bootstrap

    row = Row(run, run.metrics())
    if ref is None:
        return row
    row.ref = ref
    if run.samples and ref.samples:
        common = set(run.ids) & set(ref.ids)
        row.common = len(common)
        if not common:
            return row
        a = run.metrics() if common == set(run.ids) else compute_metrics(run, common)
        b = ref.metrics() if common == set(ref.ids) else compute_metrics(ref, common)
    else:  # a writer without samples: compare whole-run summaries
        a, b = row.m, ref.metrics()
        row.common = min(a.n, b.n)
    row.rel_calls = _ratio(a.calls_per_token, b.calls_per_token)
    row.rel_blocks = _ratio(a.blocks_per_token, b.blocks_per_token)
    row.speedup = _ratio(a.tokens_per_s, b.tokens_per_s)
    row.tps_common, row.ref_tps_common = a.tokens_per_s, b.tokens_per_s
    row.pass_common, row.ref_pass_common = a.pass_at_1, b.pass_at_1
    both = sorted(set(a.passed) & set(b.passed))
    if both:
        if run is ref:
            row.delta, row.ci = 0.0, (0.0, 0.0)
        else:
            bs = paired_bootstrap([b.passed[i] for i in both], [a.passed[i] for i in both],
                                  n_resamples=n_boot, seed=seed)
            row.delta, row.ci = bs.diff, (bs.lo, bs.hi)
        if len(both) < row.common:  # pass@1 compared on the prompts both scored
            row.pass_common = sum(a.passed[i] for i in both) / len(both)
            row.ref_pass_common = sum(b.passed[i] for i in both) / len(both)
    row.A = ref.metrics().A
    if row.A is not None and row.m.c_D is not None and row.m.c_V is not None and row.m.c_D + row.m.c_V > 0:
        row.K_star = break_even_length(row.A, row.m.c_D, row.m.c_V)
    return row


# --------------------------------------------------------------------------- frontiers


def pareto_front(xs: Sequence[float], ys: Sequence[float], x_max: bool = True, y_max: bool = True) -> list[bool]:
    """Which points no other point dominates (as good in both coordinates, better in one).
    ``x_max``/``y_max``: whether larger is better on that axis."""
    sx, sy = (1 if x_max else -1), (1 if y_max else -1)
    pts = [(sx * x, sy * y) for x, y in zip(xs, ys)]
    out = []
    for i, (x, y) in enumerate(pts):
        dominated = any(a >= x and b >= y and (a > x or b > y) for j, (a, b) in enumerate(pts) if j != i)
        out.append(not dominated)
    return out


def in_main_grid(row: Row, k_min: int) -> bool:
    """Frontier members: lenience, top-k, periodic, and signal runs at the main ``k_min`` with
    both gates on (the ``k_min`` diagnostic and the gate ablation are reported apart)."""
    m = row.method
    if m in ("lenience", "topk", "periodic"):
        return True
    if m in SIGNALS:
        eb, ec = row.p("eta_b"), row.p("eta_c")
        return row.p("k_min") in (k_min, None) and (eb is None or eb > 0) and (ec is None or ec > 0)
    return False


# --------------------------------------------------------------------------- tables


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.2f}"
    return str(v)


@dataclass
class Table:
    name: str
    columns: list[str]
    rows: list[list]

    def markdown(self) -> str:
        head = "| " + " | ".join(self.columns) + " |"
        sep = "|" + "|".join("---" for _ in self.columns) + "|"
        body = ["| " + " | ".join(_fmt(v).replace("|", "\\|") for v in r) + " |" for r in self.rows]
        return "\n".join([head, sep, *body])

    def write(self, out: Path) -> None:
        (out / f"{self.name}.md").write_text(self.markdown() + "\n")
        with open(out / f"{self.name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(self.columns)
            for r in self.rows:
                w.writerow(["" if v is None else v for v in r])


def _params_str(row: Row) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.run.params.items()
                     if v is not None)


def _ci(row: Row):
    if row.delta is None:
        return None
    return f"{row.delta:+.4f} [{row.ci[0]:+.4f}, {row.ci[1]:+.4f}]"


def runs_table(name: str, rows: list[Row]) -> Table:
    cols = ["config", "method", "parameters", "prompts", "pass@1", "Δpass@1 vs strict [95% CI]", "tokens/s",
            "speedup", "rel. calls", "rel. blocks", "StrictToken", "FullPrefix", "skipped rounds"]
    return Table(name, cols, [
        [r.name, LABELS.get(r.method, r.method), _params_str(r), r.m.n, r.m.pass_at_1, _ci(r), r.m.tokens_per_s,
         r.speedup, r.rel_calls, r.rel_blocks, r.m.strict_token, r.m.full_prefix, r.m.skipped_rounds]
        for r in rows])


def gate_table(name: str, rows: list[Row]) -> Table | None:
    """Table 2: signal runs with both gates on next to the variants that drop one gate (threshold
    0), for the paper's fixed settings or wherever both variants were run."""
    variant = {"raw": "Geometric only", "conditional": "Product only", "marginal": "Prefix only"}
    out = []
    for full in rows:
        if full.method not in SIGNALS or not (full.p("eta_b") and full.p("eta_c")):
            continue
        same = [r for r in rows if r.method == full.method and r.p("k_min") == full.p("k_min")
                and r.p("s_max") == full.p("s_max")]
        local = [r for r in same if r.p("eta_b") == full.p("eta_b") and r.p("eta_c") == 0]
        other = [r for r in same if r.p("eta_b") == 0 and r.p("eta_c") == full.p("eta_c")]
        at_default = (full.p("eta_b"), full.p("eta_c")) == DEFAULT_GATES[full.method]
        if not (local and other) and not (at_default and (local or other)):
            continue  # a local-only run is the variant of one full setting, not of every eta_c
        variants = [("Full", full)] + [("Local only", x) for x in local] + [(variant[full.method], x) for x in other]
        for label, r in variants:
            out.append([LABELS[full.method], label, r.name, r.m.pass_at_1, r.m.tokens_per_s, r.rel_calls, r.rel_blocks])
    if not out:
        return None
    return Table(name, ["signal", "policy", "config", "pass@1", "tokens/s", "rel. calls", "rel. blocks"], out)


def periodic_table(name: str, rows: list[Row], k_min: int) -> Table | None:
    """Table 3, with the run of the raw-confidence sweep (if any) that dominates each periodic
    setting in both pass@1 and relative calls."""
    per = sorted((r for r in rows if r.method == "periodic"), key=lambda r: r.p("period") or 0)
    if not per:
        return None
    raws = [r for r in rows if r.method == "raw" and in_main_grid(r, k_min) and r.pass_common is not None
            and r.rel_calls is not None]
    out = []
    for r in per:
        dom = None
        if r.pass_common is not None and r.rel_calls is not None:
            cands = [q for q in raws if q.pass_common >= r.pass_common and q.rel_calls <= r.rel_calls
                     and (q.pass_common > r.pass_common or q.rel_calls < r.rel_calls)]
            dom = min(cands, key=lambda q: q.rel_calls).name if cands else "no"
        out.append([r.p("period"), r.name, r.m.pass_at_1, r.m.tokens_per_s, r.rel_calls, r.m.strict_token, dom])
    return Table(name, ["P", "config", "pass@1", "tokens/s", "rel. calls", "agreement", "dominated by raw"], out)


def matched_table(name: str, rows: list[Row], k_min: int) -> Table | None:
    """§5.2: per method, observed points whose pass@1 equals (or is at least) Strict SDD's on the
    same prompts: the one with the fewest calls and the fastest one."""
    out = []
    for m in FRONTIER_METHODS:
        pts = [r for r in rows if r.method == m and in_main_grid(r, k_min) and r.pass_common is not None
               and r.ref_pass_common is not None and r.rel_calls is not None]
        if not pts:
            continue
        for crit, ok in (("=", lambda r: abs(r.pass_common - r.ref_pass_common) < 1e-9),
                         ("≥", lambda r: r.pass_common >= r.ref_pass_common - 1e-9)):
            hits = [r for r in pts if ok(r)]
            if not hits:
                out.append([LABELS[m], crit, "none observed"] + [None] * 8)
                continue
            fewest = min(hits, key=lambda r: (r.rel_calls, -(r.m.tokens_per_s or 0)))
            fastest = max(hits, key=lambda r: ((r.speedup or 0), -r.rel_calls))
            for pick, r in (("fewest calls", fewest), ("fastest", fastest)):
                if pick == "fastest" and r is fewest:
                    continue
                out.append([LABELS[m], crit, pick, r.name, r.pass_common, r.rel_calls, 1 - r.rel_calls,
                            r.tps_common, r.ref_tps_common, r.m.strict_token, r.m.full_prefix])
    if not out:
        return None
    return Table(name, ["method", "pass@1 vs strict", "pick", "config", "pass@1", "rel. calls", "call reduction",
                        "tokens/s", "strict tokens/s", "StrictToken", "FullPrefix"], out)


def eq8_table(name: str, rows: list[Row]) -> Table | None:
    out = [[r.name, LABELS.get(r.method, r.method), r.p("k_min"), None if r.m.c_D is None else 1e3 * r.m.c_D,
            None if r.m.c_V is None else 1e3 * r.m.c_V, r.A, r.K_star, r.m.tokens_per_s]
           for r in rows if r.method not in ("ar",)]
    if not out:
        return None
    return Table(name, ["config", "method", "k_min", "c_D (ms/block)", "c_V (ms/call)", "A (strict)", "K*", "tokens/s"],
                 out)


@dataclass
class KminFamily:
    method: str
    key: tuple  # (eta_b, eta_c, s_max)
    rows: list[Row]
    K_star: float | None  # from the Strict SDD run's own c_D, c_V and A
    predicted: int | None
    best: int | None

    @property
    def agrees(self) -> bool | None:
        """Whether Eq. 8's prediction is the best observed k_min."""
        return None if self.predicted is None or self.best is None else self.predicted == self.best

    @property
    def above(self) -> bool | None:
        """The weaker check: whether the best observed k_min lies above K* (k_min 0 counts as 1)."""
        return None if self.K_star is None or self.best is None else max(self.best, 1) > self.K_star


def kmin_families(rows: list[Row]) -> list[KminFamily]:
    """Signal runs that differ only in ``k_min`` (Figure 5), with the Eq. 8 prediction: the
    smallest ``k_min`` of the grid above ``K* = A c_D / (c_D + c_V)``, against the observed best
    (highest tokens/s). A skip commits at least one token (``K_hat > 0``), so ``k_min`` 0 acts as 1:
    when ``K* < 1`` every skip pays and the prediction is the grid's smallest ``k_min``."""
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.method in SIGNALS and r.p("k_min") is not None and (r.p("eta_b") or 0) > 0 and (r.p("eta_c") or 0) > 0:
            groups.setdefault((r.method, r.p("eta_b"), r.p("eta_c"), r.p("s_max")), []).append(r)
    fams = []
    for (m, *key), rs in groups.items():
        if len({r.p("k_min") for r in rs}) < 2:
            continue
        rs = sorted(rs, key=lambda r: r.p("k_min"))
        ref = next((r.ref for r in rs if r.ref is not None), None)
        K = None
        if ref is not None:
            rm = ref.metrics()
            if rm.A is not None and rm.c_D is not None and rm.c_V is not None and rm.c_D + rm.c_V > 0:
                K = break_even_length(rm.A, rm.c_D, rm.c_V)
        grid = [r.p("k_min") for r in rs]
        predicted = min((k for k in grid if max(k, 1) > K), default=None) if K is not None else None
        timed = [r for r in rs if r.m.tokens_per_s is not None]
        best = max(timed, key=lambda r: r.m.tokens_per_s).p("k_min") if timed else None
        fams.append(KminFamily(m, tuple(key), rs, K, predicted, best))
    return fams


def kmin_table(name: str, fams: list[KminFamily]) -> Table | None:
    out = []
    for f in fams:
        for r in f.rows:
            out.append([LABELS[f.method], f"eta_b={f.key[0]:g}, eta_c={f.key[1]:g}, s_max={f.key[2]}", r.p("k_min"),
                        r.name, r.rel_calls, r.rel_blocks, r.m.tokens_per_s, r.m.pass_at_1, f.K_star, f.predicted,
                        f.best, f.agrees, f.above])
    if not out:
        return None
    return Table(name, ["signal", "setting", "k_min", "config", "rel. calls", "rel. blocks", "tokens/s", "pass@1",
                        "K* (strict)", "predicted k_min", "best k_min", "agree", "best above K*"], out)


def table4(groups: dict, k_min: int) -> tuple[Table | None, list[str]]:
    """Table 4 for every task: Strict SDD and each signal at its fixed setting (the paper's
    thresholds, the main ``k_min``), one row per ``s_max``."""
    out, notes = [], []
    for (task, gamma), rows in groups.items():
        strict = [r for r in rows if r.method == "strict"]
        if not strict:
            continue
        s = strict[0]
        out.append([task, gamma, "Strict SDD", None, s.m.pass_at_1, s.m.tokens_per_s, 1.0 if s.rel_calls else None,
                    s.m.strict_token, s.name])
        for m in SIGNALS:
            eb, ec = DEFAULT_GATES[m]
            hits = [r for r in rows if r.method == m and r.p("eta_b") == eb and r.p("eta_c") == ec
                    and r.p("k_min") == k_min]
            if not hits and any(r.method == m for r in rows):
                notes.append(f"Table 4, {task}: no {m} run at the fixed setting eta_b={eb}, eta_c={ec}, k_min={k_min}")
            for r in sorted(hits, key=lambda r: r.p("s_max") or 0):
                out.append([task, gamma, LABELS[m], r.p("s_max"), r.m.pass_at_1, r.m.tokens_per_s, r.rel_calls,
                            r.m.strict_token, r.name])
    if not out:
        return None, notes
    return Table("table4", ["dataset", "gamma", "method", "S_max", "score", "tokens/s", "rel. calls",
                            "strict agreement", "config"], out), notes


# --------------------------------------------------------------------------- figures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def frontiers(rows: list[Row], x: Callable, y: Callable, x_max: bool, y_max: bool, k_min: int) -> dict:
    """Per method of :data:`FRONTIER_METHODS`: ``[(row, on_frontier)]`` over its main-grid runs
    with both coordinates known."""
    out = {}
    for m in FRONTIER_METHODS:
        pts = [r for r in rows if r.method == m and in_main_grid(r, k_min) and x(r) is not None and y(r) is not None]
        if pts:
            out[m] = list(zip(pts, pareto_front([x(r) for r in pts], [y(r) for r in pts], x_max, y_max)))
    return out


def _frontier_panel(ax, rows: list[Row], strict: Row | None, x: Callable, y: Callable, x_max: bool, y_max: bool,
                    xlabel: str, ylabel: str, k_min: int) -> list[str]:
    """Draw each method's frontier (solid) and its dominated settings (faded) on ``ax``; returns
    the names of the runs drawn."""
    drawn = []
    for m, pts in frontiers(rows, x, y, x_max, y_max, k_min).items():
        on = sorted((x(r), y(r)) for r, f in pts if f)
        off = [(x(r), y(r)) for r, f in pts if not f]
        ax.plot([a for a, _ in on], [b for _, b in on], "-o", color=COLORS[m], label=LABELS[m], ms=5)
        if off:
            ax.plot([a for a, _ in off], [b for _, b in off], "o", color=COLORS[m], alpha=0.25, ms=5)
        drawn += [r.name for r, _ in pts]
    if strict is not None and x(strict) is not None and y(strict) is not None:
        ax.plot([x(strict)], [y(strict)], "k*", ms=12, label="Strict SDD")
        drawn.append(strict.name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    return drawn


def figure1(path: Path, title: str, rows: list[Row], strict: Row | None, k_min: int) -> list[str]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    drawn = _frontier_panel(ax, rows, strict, lambda r: r.m.tokens_per_s, lambda r: r.m.strict_token, True, True,
                            "tokens/s", "strict token agreement", k_min)
    ax.set_title(f"Figure 1: {title}", fontsize=9)
    fig.tight_layout()
    if drawn:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn


def figure4(path: Path, title: str, rows: list[Row], strict: Row | None, k_min: int) -> list[str]:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    d1 = _frontier_panel(axes[0], rows, strict, lambda r: r.rel_calls, lambda r: r.pass_common, False, True,
                         "relative verifier calls", "pass@1", k_min)
    d2 = _frontier_panel(axes[1], rows, strict, lambda r: r.rel_calls, lambda r: r.m.strict_token, False, True,
                         "relative verifier calls", "strict token agreement", k_min)
    fig.suptitle(f"Figure 4: {title}", fontsize=9)
    fig.tight_layout()
    drawn = list(dict.fromkeys(d1 + d2))
    if drawn:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn


def figure5(path: Path, title: str, fam: KminFamily) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    ks = [r.p("k_min") for r in fam.rows]
    for ax, (label, f) in zip(axes, (("relative verifier calls", lambda r: r.rel_calls),
                                     ("relative draft blocks", lambda r: r.rel_blocks),
                                     ("tokens/s", lambda r: r.m.tokens_per_s))):
        pts = [(k, f(r)) for k, r in zip(ks, fam.rows) if f(r) is not None]
        ax.plot([k for k, _ in pts], [v for _, v in pts], "-o", color=COLORS.get(fam.method, "C0"))
        if fam.K_star is not None:
            ax.axvline(fam.K_star, color="k", ls="--", lw=1, label=f"K* = {fam.K_star:.2f} (Eq. 8)")
            ax.legend(fontsize=7)
        ax.set_xlabel("k_min")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Figure 5: {title}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    groups: dict[tuple, list[Row]] = {}
    for r in usable:
        ref = choose_reference(r, strict_runs)
        row = _guarded(notes, f"{r.label}: metrics", lambda: compare(r, ref, n_boot, seed))
        if row is None:
            continue
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
