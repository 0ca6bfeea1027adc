"""The workers of ``vskip sweep``: each process (or Ray actor) loads the model pair once and runs
many units of work (one configuration x one shard of prompts)."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from ..engine.models.config import ModelConfig
from .runner import RunConfig


@dataclass(frozen=True)
class Unit:
    """One configuration x one shard. ``out`` is the configuration's directory when the
    configuration has a single shard, else its shard directory."""

    name: str
    shard: int
    cfg: RunConfig
    out: Path
    n_prompts: int


# --------------------------------------------------------------------------- models per process


def load_models(models: ModelConfig, need_drafter: bool):
    """The default pair factory: the model pair of ``models``, loaded once per worker."""
    from ..engine.door import open_models

    return open_models(models, need_drafter)


class _PairCache:
    """The pair of one worker process, loaded on first use. Methods without a drafter (``ar``)
    get the same verifier without the drafter."""

    def __init__(self, factory, models: ModelConfig, need_drafter: bool):
        self.factory, self.models, self.need_drafter = factory, models, need_drafter
        self.pair = None

    def get(self, uses_drafter: bool):
        if self.pair is None:
            self.pair = self.factory(self.models, self.need_drafter)
        if uses_drafter or self.pair.drafter is None or not dataclasses.is_dataclass(self.pair):
            return self.pair
        identity = {k: v for k, v in self.pair.identity.items() if k != "drafter"}
        return dataclasses.replace(self.pair, drafter=None, identity=identity)


def _run_unit(unit: Unit, cache: _PairCache) -> str | None:
    """Run one unit; returns None, or a one-line error (the sweep carries on with other units).
    A unit whose run directory another process is writing is left to that process: two sweeps
    on one directory share its configurations, each taking the next one nobody holds."""
    from ..files import Busy
    from .runner import run

    pair = cache.get(unit.cfg.policy.uses_drafter)  # a failure here is fatal: it propagates
    try:
        run(unit.cfg, unit.out, progress=False, pair=pair)
    except Busy:
        print(f"vskip: {unit.name}[{unit.shard}] is being run by another process; left to it", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - reported per unit; the rest of the sweep goes on
        return f"{unit.name}[{unit.shard}]: {type(e).__name__}: {e}"
    return None


_WORKER: _PairCache | None = None


def exit_with_parent(poll: float = 1.0) -> None:
    """End this process when the process that started it is gone. A sweep killed outright (SIGKILL,
    or SIGTERM without cleanup) leaves its pool's workers behind, and they would go on taking the
    units still queued; a killed run resumes from what it wrote, so a worker may stop anywhere."""
    import os
    import threading
    import time

    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _init_worker(factory, models: ModelConfig, need_drafter: bool) -> None:
    global _WORKER
    exit_with_parent()
    _WORKER = _PairCache(factory, models, need_drafter)


def _worker_unit(unit: Unit) -> str | None:
    assert _WORKER is not None
    return _run_unit(unit, _WORKER)


class _RayWorker:
    """A Ray actor holding one model pair; runs units sent to it."""

    def __init__(self, factory, models: ModelConfig, need_drafter: bool):
        self.cache = _PairCache(factory, models, need_drafter)

    def run(self, unit: Unit) -> str | None:
        return _run_unit(unit, self.cache)


def _run_pool(units, workers, factory, models, need_drafter, bar) -> list[str]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    errors = []
    ctx = mp.get_context("spawn")  # no forked torch state
    with ProcessPoolExecutor(max_workers=min(workers, len(units)), mp_context=ctx, initializer=_init_worker,
                             initargs=(factory, models, need_drafter)) as ex:
        futs = {ex.submit(_worker_unit, u): u for u in units}
        try:
            for f in as_completed(futs):
                err = f.result()  # an exception here (model loading) stops the sweep
                errors += [err] if err else []
                bar.unit_done(futs[f])
        except BaseException:
            for f in futs:
                f.cancel()
            raise
    return errors


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs the ray package (pip install ray)") from None
    return ray


def _run_ray(units, workers, address, factory, models, need_drafter, gpus, bar) -> list[str]:
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True)
    actor = ray.remote(num_gpus=gpus)(_RayWorker) if gpus else ray.remote(_RayWorker)
    pool = [actor.remote(factory, models, need_drafter) for _ in range(min(workers, len(units)))]
    queue = list(units)
    running = {}
    errors = []
    try:
        for a in pool:
            if queue:
                u = queue.pop(0)
                running[a.run.remote(u)] = (a, u)
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            a, u = running.pop(ready[0])
            try:
                err = ray.get(ready[0])
            except ray.exceptions.RayError as e:
                last = str(e).strip().splitlines()[-1]
                raise ValueError(f"a Ray worker failed on {u.name}[{u.shard}]: {last}") from None
            errors += [err] if err else []
            bar.unit_done(u)
            if queue:
                nxt = queue.pop(0)
                running[a.run.remote(nxt)] = (a, nxt)
    finally:
        for a in pool:
            ray.kill(a)
    return errors
