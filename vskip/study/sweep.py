"""``vskip sweep``: every configuration of a named grid, run as resumable units of work.

A grid (A.6 Table 5, the ``k_min`` diagnostic of Figure 5, the gate ablation of Table 2, the
periodic baseline of Table 3, small grids for a CPU) is a list of :class:`PolicyConfig`. Each
configuration gets a run directory ``DIR/<name>`` (``raw_eb0.90_ec0.93_k6_s64``) holding exactly
what ``vskip run`` would write for it, and ``DIR/sweep.json`` records the grid, the task and the
prompt selection.

The unit of work is one configuration x one shard of the selected prompts. A worker process loads
the model pair once and runs many units; each unit is an ordinary :func:`vskip.study.runner.run` (its own
warm-up, per-prompt timing, resume). With one shard per configuration the unit writes straight into
the configuration's directory; with more, shards write ``DIR/_shards/<name>/<k>`` and are merged,
in the selection's order, into a directory identical to a single-process run (timings aside).

Resume: rerunning the same command skips finished configurations and, inside unfinished units,
finished prompts, so a killed sweep loses at most the prompts in flight.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..defaults import K_MIN, S_MAX
from ..engine.decode import DecodeConfig
from ..engine.metrics import summarize
from ..engine.models.config import ModelConfig
from ..files import DirLock, FileError, own_dir
from ..files import read_jsonl as _read_jsonl
from ..files import write_json
from ..files import write_jsonl as _write_jsonl
from .grids import GRIDS, GridPoint, grid
from .rundir import CONFIG, ROUNDS, SAMPLES, SUMMARY, SWEEP, read_rounds
from .runner import RunConfig
from .sweep_workers import Unit, _import_ray, _PairCache, _run_pool, _run_ray, _run_unit, load_models

SHARDS = "_shards"


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class SweepPlan:
    task: str
    grid: str
    points: tuple[GridPoint, ...]
    selection: tuple[str, ...]
    configs: dict  # name -> RunConfig of the whole selection
    shards: int
    skipped: tuple[tuple[str, str], ...]  # (name, why)

    def shard_ids(self) -> list[tuple[str, ...]]:
        """The selection cut into ``shards`` contiguous pieces, in order."""
        n, s = len(self.selection), self.shards
        cuts = [round(i * n / s) for i in range(s + 1)]
        return [self.selection[a:b] for a, b in zip(cuts, cuts[1:])]

    def units(self, out: Path) -> list[Unit]:
        out = Path(out)
        res = []
        pieces = self.shard_ids()
        for name, cfg in self.configs.items():
            if self.shards == 1:
                res.append(Unit(name, 0, cfg, out / name, len(self.selection)))
                continue
            for k, ids in enumerate(pieces):
                shard_cfg = dataclasses.replace(cfg, limit=None, ids=list(ids))  # list: see plan()
                res.append(Unit(name, k, shard_cfg, out / SHARDS / name / f"{k:03d}", len(ids)))
        return res


def plan(
    task: str,
    grid_name: str,
    decode: DecodeConfig,
    models: ModelConfig,
    limit: int | None = None,
    ids: Sequence[str] | None = None,
    predictor: str | None = None,
    score: bool = True,
    shards: int = 1,
    k_min: int = K_MIN,
    s_max: int = S_MAX,
    batch_size: int = 1,
) -> SweepPlan:
    """Resolve a grid and a prompt selection into the configurations to run. Learned signals are
    left out (and listed in ``skipped``) when there is no ``predictor``. ``batch_size``: the
    sequences each run decodes side by side (:attr:`RunConfig.batch_size`), in every worker."""
    from ..bench import tasks

    if task not in tasks.ALL_TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(tasks.ALL_TASKS)}")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    if shards < 1:
        raise ValueError(f"--shards must be >= 1, got {shards}")
    ids = tuple(ids) if ids else None
    selection = tuple(p.task_id for p in tasks.load_task(task, limit=limit, ids=list(ids) if ids else None))
    if not selection:
        raise ValueError(f"no prompts selected from {task}")
    points, skipped, configs = [], [], {}
    for pt in grid(grid_name, k_min=k_min, s_max=s_max):
        if pt.policy.learned and not predictor:
            skipped.append((pt.name, "needs --predictor"))
            continue
        points.append(pt)
        # ids as a list: the runner compares its config with the JSON it wrote when resuming, and
        # a list survives that round trip where a tuple does not.
        configs[pt.name] = RunConfig(task=task, policy=pt.policy, decode=decode, models=models, limit=limit,
                                     ids=list(ids) if ids else None, score=score,
                                     predictor=predictor if pt.policy.learned else None, batch_size=batch_size)
    if not configs:
        raise ValueError(f"every configuration of grid {grid_name} needs --predictor")
    return SweepPlan(task, grid_name, tuple(points), selection, configs, min(shards, len(selection)), tuple(skipped))


# --------------------------------------------------------------------------- progress


def _count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


class _Progress:
    """A tqdm bar over the prompts of the units still to run, with configurations done as its
    postfix. It counts finished lines in the units' samples files, so it works the same for
    in-process, pooled and Ray workers."""

    def __init__(self, units: list[Unit], n_configs: int, done_configs: int, enabled: bool):
        from tqdm import tqdm

        self.units, self.n_configs, self.done_configs = units, n_configs, done_configs
        self.per = {u.out: u.n_prompts for u in units}
        self.counts = {u.out: min(_count_lines(u.out / SAMPLES), u.n_prompts) for u in units}
        self.finished: set[Path] = set()
        self.bar = tqdm(total=sum(self.per.values()), initial=sum(self.counts.values()), desc="sweep",
                        unit="prompt", disable=not enabled, file=sys.stderr, dynamic_ncols=True)
        self._postfix()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True) if enabled else None
        if self._thread:
            self._thread.start()

    def _postfix(self):
        open_names = {u.name for u in self.units if u.out not in self.finished}
        done = self.done_configs + len({u.name for u in self.units} - open_names)
        self.bar.set_postfix_str(f"configs {done}/{self.n_configs}")

    def refresh(self):
        with self._lock:
            for u in self.units:
                if u.out in self.finished:
                    continue
                n = min(_count_lines(u.out / SAMPLES), self.per[u.out])
                if n > self.counts[u.out]:
                    self.bar.update(n - self.counts[u.out])
                    self.counts[u.out] = n

    def unit_done(self, unit: Unit):
        self.refresh()
        with self._lock:
            self.finished.add(unit.out)
            self._postfix()

    def _poll(self):
        while not self._stop.wait(2.0):
            self.refresh()

    def close(self):
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.refresh()
        self.bar.close()


# --------------------------------------------------------------------------- merge


def _summarize_keys() -> set[str]:
    return set(summarize([], []))


def config_done(run_dir: Path, n_prompts: int) -> bool:
    """A run directory is finished when its summary covers every selected prompt."""
    p = Path(run_dir) / SUMMARY
    if not p.exists():
        return False
    try:
        return json.loads(p.read_text()).get("n_prompts") == n_prompts
    except (json.JSONDecodeError, OSError):
        return False


def merge_shards(run_dir: Path, cfg: RunConfig, shard_dirs: Sequence[Path], selection: Sequence[str]) -> dict:
    """Merge finished shard run directories into ``run_dir`` as one run of ``cfg`` over
    ``selection``: samples and rounds in selection order, the summary recomputed over all of
    them; ``summary.json`` is written last. Returns the summary."""
    samples, rounds = {}, {}
    for d in shard_dirs:
        for s in _read_jsonl(Path(d) / SAMPLES):
            samples[s["task_id"]] = s
        for r in read_rounds(Path(d) / ROUNDS):
            rounds.setdefault(r.task_id, []).append(r)
    missing = [i for i in selection if i not in samples]
    if missing:
        raise ValueError(f"cannot merge {run_dir}: {len(missing)} prompts have no sample (first {missing[0]})")
    ordered = [samples[i] for i in selection]
    all_rounds = [r for i in selection for r in rounds.get(i, [])]
    head = json.loads((Path(shard_dirs[0]) / CONFIG).read_text())
    head["run"] = cfg.to_json()
    shard_summary = json.loads((Path(shard_dirs[0]) / SUMMARY).read_text())
    keys = _summarize_keys()
    summary = {k: v for k, v in shard_summary.items() if k not in keys} | summarize(ordered, all_rounds)
    run_dir = own_dir(run_dir)
    (run_dir / SUMMARY).unlink(missing_ok=True)
    write_json(run_dir / CONFIG, head)
    _write_jsonl(run_dir / ROUNDS, (r.to_json() for r in all_rounds))
    _write_jsonl(run_dir / SAMPLES, ordered)
    write_json(run_dir / SUMMARY, summary)
    return summary


# --------------------------------------------------------------------------- the sweep


def _sweep_record(p: SweepPlan, command: str | None) -> dict:
    return {
        "task": p.task,
        "grid": p.grid,
        "grid_description": GRIDS[p.grid][0],
        "grids": [p.grid],
        "selection": list(p.selection),
        "shards": p.shards,
        "configs": [{"name": pt.name, "role": pt.role, **pt.policy.summary(), "run": p.configs[pt.name].to_json()}
                    for pt in p.points],
        "skipped": [{"name": n, "why": w} for n, w in p.skipped],
        "command": command,
    }


def _check_and_record(p: SweepPlan, out: Path, command: str | None) -> SweepPlan:
    """Refuse to mix two different sweeps in one directory; on resume keep the recorded shard
    layout (prompts finished in a shard stay there) and record any configurations added."""
    path = out / SWEEP
    rec = json.loads(json.dumps(_sweep_record(p, command)))  # tuples as lists, as read back
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            old = None
        if not isinstance(old, dict):  # vskip writes it atomically: a damaged one is not vskip's
            raise FileError(f"{path} is not a sweep record vskip can read; remove it or choose another --out")
        if old is not None:
            if old.get("task") != p.task or old.get("selection") != list(p.selection):
                raise ValueError(f"{out} holds a sweep of another task or prompt selection; choose another --out")
            before = {c["name"]: c.get("run") for c in old.get("configs", [])}
            for c in rec["configs"]:
                if c["name"] in before and before[c["name"]] != c["run"]:
                    raise ValueError(f"{out} holds {c['name']} with other settings (model, decode or selection flags); "
                                     "choose another --out")
            if old.get("shards", p.shards) != p.shards:
                print(f"vskip: {out} was sharded {old['shards']} ways; keeping that", file=sys.stderr)
                p = dataclasses.replace(p, shards=int(old["shards"]))
                rec["shards"] = p.shards
            # configurations of the earlier run stay listed
            names = {c["name"] for c in rec["configs"]}
            rec["configs"] += [c for c in old.get("configs", []) if c["name"] not in names]
            rec["grids"] = list(dict.fromkeys(old.get("grids", [old.get("grid")]) + [p.grid]))
            if command is None:
                rec["command"] = old.get("command")
    own_dir(out)
    write_json(path, rec)
    return p


def run_sweep(
    p: SweepPlan,
    out: Path,
    workers: int = 1,
    executor: str = "local",
    address: str | None = None,
    pair_factory: Callable | None = None,
    progress: bool = True,
    command: str | None = None,
    gpus_per_worker: float = 0.0,
) -> dict:
    """Run (or finish) every configuration of ``p`` under ``out``; returns
    ``{name: summary}``. ``pair_factory(models, need_drafter)`` returns a loaded model pair
    (default :func:`load_models`); tests pass a fake one. Raises ValueError when units failed,
    after running all the others."""
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if executor not in ("local", "ray"):
        raise ValueError(f"unknown executor {executor!r}; expected local or ray")
    if executor == "ray":
        _import_ray()  # before anything is written
    out = own_dir(out)
    with DirLock(out, "sweep directory"):
        return _run_locked(p, out, workers, executor, address, pair_factory, progress, command, gpus_per_worker)


def _run_locked(p: SweepPlan, out: Path, workers: int, executor: str, address, pair_factory, progress: bool,
                command: str | None, gpus_per_worker: float) -> dict:
    p = _check_and_record(p, out, command)
    factory = pair_factory or load_models
    for name, why in p.skipped:
        print(f"vskip: skipping {name}: {why}", file=sys.stderr)

    n = len(p.selection)
    done = {name for name in p.configs if config_done(out / name, n)}
    for name in done:  # shards left by a sweep killed right after their merge
        if (out / SHARDS / name).exists():
            shutil.rmtree(out / SHARDS / name)
    units = [u for u in p.units(out) if u.name not in done]
    # Shards finished by an earlier, interrupted sweep need no rerun, only the merge.
    todo = [u for u in units if u.out == out / u.name or not config_done(u.out, u.n_prompts)]
    need_drafter = any(p.configs[u.name].policy.uses_drafter for u in todo)
    models = next(iter(p.configs.values())).models
    threads = models.threads
    if threads is None and workers > 1 and executor == "local" and (models.device or "cpu") == "cpu":
        threads = max(1, (os.cpu_count() or 1) // workers)  # no oversubscription; not part of the config
    load_cfg = dataclasses.replace(models, threads=threads)

    bar = _Progress(units, len(p.configs), len(done), progress) if units else None
    errors: list[str] = []
    try:
        if todo:
            if executor == "ray":
                errors = _run_ray(todo, workers, address, factory, load_cfg, need_drafter, gpus_per_worker, bar)
            elif workers == 1:
                cache = _PairCache(factory, load_cfg, need_drafter)
                for u in todo:
                    err = _run_unit(u, cache)
                    errors += [err] if err else []
                    bar.unit_done(u)
            else:
                errors = _run_pool(todo, workers, factory, load_cfg, need_drafter, bar)
        # Merge configurations whose shards are all finished.
        for name, cfg in p.configs.items():
            if name in done or p.shards == 1:
                continue
            shard_dirs = [out / SHARDS / name / f"{k:03d}" for k in range(p.shards)]
            sizes = [len(ids) for ids in p.shard_ids()]
            if all(config_done(d, s) for d, s in zip(shard_dirs, sizes)):
                merge_shards(out / name, cfg, shard_dirs, p.selection)
                shutil.rmtree(out / SHARDS / name)
    finally:
        if bar:
            bar.close()
    if (out / SHARDS).exists() and not any((out / SHARDS).iterdir()):
        (out / SHARDS).rmdir()
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValueError(f"{len(errors)} of {len(todo)} units failed; rerun to retry them. First: {errors[0]}{more}")
    return {name: json.loads((out / name / SUMMARY).read_text()) for name in p.configs
            if (out / name / SUMMARY).exists()}
