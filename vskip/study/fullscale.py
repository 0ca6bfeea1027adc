"""The full-scale study (docs/results/full.md, docs/results/scheduler.md) as pieces that each end
in files a commit keeps: Strict SDD traces, the predictors trained on them, the grid ``full``,
the key points timed again, the on-policy rounds of the prefix model, and the reports. What each
piece decodes, which runs exist, and which runs each report sets side by side are decided here;
the decoding itself is vskip commands handed to a :class:`~vskip.study.jobs.Runner`.

``runs`` (``runs/full``) holds the run directories; ``results`` (``docs/results/full``) what is
committed. Run directories are named by :func:`vskip.study.grids.config_name` through the grids."""

from __future__ import annotations

import gzip
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ..bench.tasks import TASKS, load_task
from ..files import copy_file, read_json, write_atomic
from .compare import SETTINGS
from .grids import GridPoint, grid
from .jobs import Runner
from .rundir import ARCHIVE, CONFIG, SUMMARY

#: the study's tasks and how many of their prompts (the first ones): all of HumanEval, 200 of MBPP
STUDY_TASKS = (("humaneval", 164), ("mbpp", 200))
#: the drafter's dtype pinned: `auto` is bfloat16 on a CPU with AVX512-BF16 or AMX and float32
#: without, and one run resumed on both kinds of machine would mix two drafters' confidences
PIN = ("--drafter-dtype", "float32")
#: the decoding commands' preset: the study shape every committed study was made in
STUDY_PRESET = ("--preset", "study")
#: the risk each on-policy round decodes at with the last round's model
ONPOLICY_ALPHA = 0.05
#: the on-policy round whose model the timing piece times (the scheduler as the study ends it)
TIMED_ROUND = 2
#: raw confidence's family timed again, (eta_b, eta_c) at these k_min: H2 and Eq. 8 are read on it
TIMED_RAW, TIMED_RAW_K_MIN = (0.7, 0.7), (0, 3, 6)
#: every n-th of a task's prompts is timed again
TIMED_EVERY = 8
#: the on-policy rounds ``pack`` looks for
MAX_ROUND = 9
#: the Strict SDD figures a task's traces must reproduce on another machine
STRICT_KEYS = ("n_prompts", "generated_tokens", "verifier_calls", "draft_blocks", "pass_at_1")


@dataclass(frozen=True)
class FullScale:
    """The settings of the study's pieces. ``limits``: the tasks and their prompts; ``only``: one
    task for sweep, timing and onpolicy-sweep; ``key``/``nocache_key``: the configurations timed
    with and without the verifier's cache (None: :meth:`timed_configs`); ``nocache_tasks``: the
    tasks timed without it."""

    runs: Path = Path("runs/full")
    results: Path = Path("docs/results/full")
    max_new_tokens: int = 256
    limits: tuple[tuple[str, int], ...] = STUDY_TASKS
    grid: str = "full"
    round: int = 1
    only: str | None = None
    key: str | None = None
    nocache_key: str | None = None
    nocache_tasks: tuple[str, ...] = ("humaneval",)

    def __post_init__(self):
        for t, n in self.limits:
            if t not in TASKS or n < 1:
                raise ValueError(f"the study's tasks are tasks of vskip with a positive limit, got {t}={n}")
        if self.only is not None and self.only not in self.tasks:
            raise ValueError(f"--only {self.only} is not a task of the study ({', '.join(self.tasks)})")
        if self.round < 1:
            raise ValueError(f"--round counts from 1, got {self.round}")
        grid(self.grid)  # a known grid

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.limits)

    def selected(self) -> tuple[tuple[str, int], ...]:
        """The tasks sweep, timing and onpolicy-sweep run: all, or ``only``."""
        return tuple((t, n) for t, n in self.limits if self.only in (None, t))

    def model(self, r: int) -> Path:
        """The prefix model of round ``r`` (round 0: trained on Strict SDD traces alone)."""
        return self.results / ("predictors" if r <= 0 else f"predictors-round{r}")

    def traces(self, task: str) -> Path:
        return self.runs / "traces" / task

    def onpolicy(self, r: int, task: str) -> Path:
        return self.runs / f"onpolicy{r}" / task

    def sweep_dir(self, task: str, r: int = 0) -> Path:
        """Round ``r``'s sweep of ``task`` (round 0: the grid's, with the model of Strict SDD traces)."""
        return self.runs / "sweeps" / task if r <= 0 else self.runs / f"sweeps-round{r}" / f"{task}-round{r}"

    def timed_configs(self, cache: bool) -> str:
        """The ``--configs`` timed again: ar, Strict SDD, the promise of round :data:`TIMED_ROUND`'s
        model at each risk of grid ``promise`` and raw confidence's :data:`TIMED_RAW` family; without
        the cache (every call recomputes the sequence) the largest risk and k_min 3 only."""
        given = self.key if cache else self.nocache_key
        if given:
            return given
        alphas = sorted({pt.policy.alpha for pt in grid("promise")}, reverse=True)
        k_mins = TIMED_RAW_K_MIN if cache else (3,)
        promise = [f"prefix+survival=model+predictor={self.model(TIMED_ROUND)}+alpha={a:g}"
                   for a in (alphas if cache else alphas[:1])]
        raw = [f"raw+eta_b={TIMED_RAW[0]:g}+eta_c={TIMED_RAW[1]:g}+k_min={k}" for k in k_mins]
        return ",".join(["ar", "strict", *promise, *raw])


def unpack(fs: FullScale) -> list[Path]:
    """The committed run directories back under ``runs``: every report's archive, and the timing
    rows. A file already here is newer than the archive's and is kept. Returns the files written."""
    written = []
    for r in [fs.results / "report", *(fs.results / f"report-round{i}" for i in range(1, MAX_ROUND + 1))]:
        if (r / ARCHIVE).is_file():
            written += _extract_new(r / ARCHIVE)
    for gz in sorted(fs.results.glob("timing/*/shard-*.jsonl.gz")):
        d = fs.runs / "timing" / gz.parent.name
        d.mkdir(parents=True, exist_ok=True)
        if not (d / SETTINGS).exists():
            copy_file(gz.parent / SETTINGS, d / SETTINGS)
        rows = d / gz.name[: -len(".gz")]
        if not rows.exists():
            written.append(write_atomic(rows, gzip.decompress(gz.read_bytes())))
    return written


def _extract_new(archive: Path) -> list[Path]:
    """The regular files of ``archive`` that are not here yet, at the relative paths it names."""
    out = []
    with tarfile.open(archive, "r:xz") as tar:
        for m in tar:
            path = Path(m.name)
            if path.is_absolute() or ".." in path.parts:
                raise ValueError(f"{archive}: {m.name} lies outside the directory it is unpacked in")
            if m.isfile() and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                out.append(write_atomic(path, tar.extractfile(m).read()))
    return out


def trace_commands(fs: FullScale) -> list[list[str]]:
    """Strict SDD traces of every task, one process and one thread each."""
    return [["run", "--task", t, "--limit", str(n), "--policy", "strict", "--trace", "--max-new-tokens",
             str(fs.max_new_tokens), "--threads", "1", *PIN, *STUDY_PRESET, "--quiet", "--out", str(fs.traces(t))]
            for t, n in fs.limits]


def train(fs: FullScale, run: Runner) -> None:
    """The traces' record committed; the marginal, conditional and prefix models trained (5 folds,
    each once); the diagnostics on one thread, as onpolicy-check runs them (the same sums in the
    same order, the same digits)."""
    traces = [str(fs.traces(t)) for t in fs.tasks]
    for t in fs.tasks:
        (fs.results / "traces" / t).mkdir(parents=True, exist_ok=True)
        for name in (CONFIG, SUMMARY):
            copy_file(fs.traces(t) / name, fs.results / "traces" / t / name)
    pred = fs.model(0)
    for kind in ("marginal", "conditional", "prefix"):
        if not (pred / kind / "manifest.json").exists():
            # two calibration folds of about 146 prompts: conformal risk control at alpha needs 1/alpha - 1
            folds = ["--calibration-folds", "2"] if kind == "prefix" else []
            run([["train-predictor", "--kind", kind, "--traces", *traces, "--out", str(pred), *folds,
                  "--threads", "2", "--quiet"]])
    run([diagnose(traces, pred, fs.results / "diagnose")])


def diagnose(traces, predictors: Path, out: Path) -> list[str]:
    return ["diagnose", *map(str, traces), "--predictors", str(predictors), "--out", str(out), "--threads", "1"]


def sweep_commands(fs: FullScale, grid_name: str, r: int = 0) -> list[list[str]]:
    """The grid on the selected tasks side by side, one worker and one thread each, with round
    ``r``'s model into round ``r``'s sweeps."""
    return [["sweep", "--task", t, "--limit", str(n), "--grid", grid_name, "--predictor", str(fs.model(r)),
             "--max-new-tokens", str(fs.max_new_tokens), "--workers", "1", "--threads", "1", *PIN, "--quiet",
             "--out", str(fs.sweep_dir(t, r))] for t, n in fs.selected()]


def every(task: str, limit: int, nth: int) -> str:
    """Every ``nth`` of the first ``limit`` prompts of ``task``, as ``--ids``."""
    return ",".join(p.task_id for p in load_task(task, limit=limit)[::nth])


def timing(fs: FullScale, run: Runner) -> None:
    """The key points timed again, paired per prompt, every :data:`TIMED_EVERY`-th prompt, two
    shards side by side: 3 interleaved repeats with the verifier's cache, then 1 without it on
    ``nocache_tasks`` (the paper timed without; a call that recomputes the sequence costs several)."""
    for cache in (True, False):
        flags = ["--verifier-cache", "--no-shadow", "--repeats", "3"] if cache else \
            ["--no-verifier-cache", "--no-shadow", "--repeats", "1"]
        for t, n in fs.selected():
            if not cache and t not in fs.nocache_tasks:
                continue
            ids = every(t, n, TIMED_EVERY)
            out = fs.runs / "timing" / f"{t}-{'cache' if cache else 'nocache'}"
            cmd = ["compare", "--task", t, "--ids", ids, "--max-new-tokens", str(fs.max_new_tokens), "--threads",
                   "1", *PIN, *STUDY_PRESET, *flags, "--predictor", str(fs.model(0)), "--configs", fs.timed_configs(cache)]
            if not run([[*cmd, "--shard", f"{i}/2", "--quiet", "--out", str(out)] for i in (1, 2)],
                       timed=True, quiet=True):
                return


def same_strict(fs: FullScale, task: str) -> None:
    """The traces made here decoded what the committed traces' summary says."""
    a = read_json(fs.traces(task) / SUMMARY)
    b = read_json(fs.results / "traces" / task / SUMMARY)
    if any(a[k] != b[k] for k in STRICT_KEYS):
        raise RuntimeError(f"the traces of {task} made here differ from the committed ones: "
                           f"{[(k, a[k], b[k]) for k in STRICT_KEYS]}")


def onpolicy(fs: FullScale, run: Runner) -> None:
    """One DAgger-style round r: decode with round r-1's model at :data:`ONPOLICY_ALPHA` (traced),
    train on the Strict SDD blocks and on every round's on-policy blocks so far, calibrate on round
    r's own. Its traces and the earlier rounds' are not committed: every round runs on the machine
    that made the earlier ones (the Strict SDD traces are made again on a fresh machine)."""
    r, prev = fs.round, fs.model(fs.round - 1)
    if not (prev / "prefix" / "manifest.json").exists():
        raise ValueError(f"no model of round {r - 1} ({prev})")
    for i in range(1, r):
        if not all((fs.onpolicy(i, t) / SUMMARY).exists() for t in fs.tasks):
            raise ValueError(f"round {r} trains on round {i}'s blocks too, which are not here: every round runs "
                             "on one machine")
    if not all((fs.traces(t) / SUMMARY).exists() for t in fs.tasks):
        print("fullscale: no traces here: making them again (a fresh machine)", file=sys.stderr)
        if not run(trace_commands(fs), timed=True):
            return
    for t in fs.tasks:
        same_strict(fs, t)
    done = run([["run", "--task", t, "--limit", str(n), "--policy", "prefix", "--predictor", str(prev), "--alpha",
                 f"{ONPOLICY_ALPHA:g}", "--trace", "--max-new-tokens", str(fs.max_new_tokens), "--threads", "1", *PIN,
                 *STUDY_PRESET, "--quiet", "--out", str(fs.onpolicy(r, t))] for t, n in fs.limits], timed=True)
    unfinished = [t for t in fs.tasks if not (fs.onpolicy(r, t) / SUMMARY).exists()]
    if unfinished:
        if not done:  # stopped at the deadline: the same step resumes it
            return
        raise RuntimeError(f"the on-policy run of {', '.join(unfinished)} is unfinished")
    model = fs.model(r)
    if not (model / "prefix" / "manifest.json").exists():
        onp = [a for i in range(1, r + 1) for a in ("--on-policy", *(str(fs.onpolicy(i, t)) for t in fs.tasks))]
        run([["train-predictor", "--kind", "prefix", "--traces", *(str(fs.traces(t)) for t in fs.tasks), *onp,
              "--calibrate-on", "on-policy", "--out", str(model), "--calibration-folds", "2", "--threads", "2",
              "--quiet"]])
    for t in fs.tasks:  # what the on-policy runs were, beside the retrained model
        (fs.results / f"onpolicy{r}" / t).mkdir(parents=True, exist_ok=True)
        for name in (CONFIG, SUMMARY):
            copy_file(fs.onpolicy(r, t) / name, fs.results / f"onpolicy{r}" / t / name)


def onpolicy_check(fs: FullScale, run: Runner) -> None:
    """Offline, on the machine that holds the traces: each model's thresholds replayed on the
    blocks of the on-policy round (round 1: round 0 on both kinds of block, and round 1 calibrated
    on Strict SDD blocks instead, beside round 1; later rounds: the last round's model and this
    round's)."""
    r = fs.round
    st = [fs.traces(t) for t in fs.tasks]
    on = [fs.onpolicy(r, t) for t in fs.tasks]
    if not all((d / SUMMARY).exists() for d in on):
        raise ValueError("run onpolicy first")
    res = fs.results
    if r == 1:
        strictcal = fs.runs / "predictors-round1-strictcal"
        run([diagnose(st, fs.model(0), res / "diagnose")])
        run([diagnose(on, fs.model(0), res / "diagnose-onpolicy1")])
        if not (strictcal / "prefix" / "manifest.json").exists():
            run([["train-predictor", "--kind", "prefix", "--traces", *map(str, st), "--on-policy", *map(str, on),
                  "--calibrate-on", "strict", "--out", str(strictcal), "--calibration-folds", "2", "--threads", "2",
                  "--quiet"]])
        run([diagnose(on, fs.model(1), res / "diagnose-onpolicy1-round1")])
        run([diagnose(on, strictcal, res / "diagnose-onpolicy1-round1-strictcal")])
    else:
        for m in (r - 1, r):
            run([diagnose(on, fs.model(m), res / f"diagnose-onpolicy{r}-round{m}")])


def onpolicy_sweep(fs: FullScale, run: Runner) -> None:
    """Round r's model at the promised risks (grid ``promise``), the selected tasks side by side."""
    model = fs.model(fs.round)
    if not (model / "prefix" / "manifest.json").exists():
        raise ValueError("run onpolicy first")
    run(sweep_commands(fs, "promise", fs.round), timed=True)


# --------------------------------------------------------------------------- the reports


def frontier_k_min(points: list[GridPoint]) -> int:
    """The one k_min of the grid's frontier signal points, which the reports draw as frontiers."""
    ks = {pt.policy.k_min for pt in points if pt.role == "frontier" and pt.policy.name in ("raw", "marginal",
                                                                                          "conditional")}
    if len(ks) != 1:
        raise ValueError(f"the grid's signal frontier has k_min {sorted(ks)}: the reports draw one")
    return ks.pop()


def report_runs(fs: FullScale) -> list[tuple[Path, list[Path]]]:
    """(report directory, the runs it sets side by side) of each report ``pack`` writes, from the
    runs that exist: the grid's sweeps of every task; then each on-policy round r's sweeps beside
    what it is measured against, per task: Strict SDD, round 0's promise, raw confidence's
    frontier (its settings at the frontier k_min) and rounds 1 .. r-1 at the same risks."""
    points = grid(fs.grid)
    k = frontier_k_min(points)
    promise = sorted(pt.name for pt in grid("promise"))
    strict = [pt.name for pt in points if pt.policy.name == "strict"]
    raw = sorted(pt.name for pt in points if pt.policy.name == "raw" and pt.role == "frontier" and pt.policy.k_min == k)
    out = []
    sweeps = [fs.sweep_dir(t) for t in fs.tasks if fs.sweep_dir(t).is_dir()]
    if sweeps:
        out.append((fs.results / "report", sweeps))
    for r in range(1, MAX_ROUND + 1):
        runs = [fs.sweep_dir(t, r) for t in fs.tasks if fs.sweep_dir(t, r).is_dir()]
        if not runs:
            break
        for t in fs.tasks:
            runs += [fs.sweep_dir(t) / name for name in [*strict, *promise, *raw] if (fs.sweep_dir(t) / name).is_dir()]
            for i in range(1, r):
                runs += [fs.sweep_dir(t, i) / name for name in promise if (fs.sweep_dir(t, i) / name).is_dir()]
        out.append((fs.results / f"report-round{r}", runs))
    return out


def report_commands(fs: FullScale) -> list[list[str]]:
    """The ``vskip report`` of each report of :func:`report_runs`, with its archive and the
    committed timings beside it (the promise's runs get their speed timed again from them)."""
    timed = [str(d.parent) for d in sorted((fs.results / "timing").glob(f"*/{SETTINGS}"))]
    k = frontier_k_min(grid(fs.grid))
    return [["report", *map(str, runs), "--frontier-k-min", str(k), *(["--timing", *timed] if timed else []),
             "--archive", "--out", str(out)] for out, runs in report_runs(fs)]


def pack(fs: FullScale, run: Runner) -> None:
    """The timing rows compressed into ``results/timing`` and summarised there; every report of
    :func:`report_runs` with its archive (every run, finished or not) and the timings beside it;
    the newest report's ``scheduler.json`` copied to where docs/results/scheduler.md reads it."""
    for d in sorted((fs.runs / "timing").glob(f"*/{SETTINGS}")):
        out = fs.results / "timing" / d.parent.name
        out.mkdir(parents=True, exist_ok=True)
        copy_file(d, out / SETTINGS)
        for rows in sorted(d.parent.glob("shard-*.jsonl")):
            _gzip_if_changed(rows, out / f"{rows.name}.gz")
        run([["compare", "--summary", "--out", str(out)]], quiet=True)
    for cmd in report_commands(fs):
        run([cmd])
    # the newest round's report holds that round, every earlier one and round 0
    for out in [*(fs.results / f"report-round{r}" for r in range(MAX_ROUND, 0, -1)), fs.results / "report"]:
        if (out / "scheduler.json").is_file():
            copy_file(out / "scheduler.json", fs.results.parent / "scheduler.json")
            break


def _gzip_if_changed(src: Path, dst: Path) -> None:
    """``dst`` holds ``src`` compressed; rewritten (deterministically) only when its rows differ, so
    that committed rows keep their bytes."""
    data = src.read_bytes()
    if dst.exists() and gzip.decompress(dst.read_bytes()) == data:
        return
    write_atomic(dst, gzip.compress(data, compresslevel=9, mtime=0))


def traces(fs: FullScale, run: Runner) -> None:
    run(trace_commands(fs))


def sweep(fs: FullScale, run: Runner) -> None:
    """The grid on the selected tasks side by side, with the model trained on Strict SDD traces."""
    run(sweep_commands(fs, fs.grid), timed=True)


#: the pieces, by the name ``vskip fullscale`` takes, in the order a study runs them
STEPS = {"unpack": lambda fs, run: unpack(fs), "traces": traces, "train": train, "sweep": sweep, "timing": timing,
         "onpolicy": onpolicy, "onpolicy-check": onpolicy_check, "onpolicy-sweep": onpolicy_sweep, "pack": pack}
#: the pieces ``only`` narrows to one task
ONE_TASK_STEPS = ("sweep", "timing", "onpolicy-sweep")
