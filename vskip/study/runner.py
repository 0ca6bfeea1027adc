"""``vskip run``: decode a task's prompts with one configuration and write the run directory.

A run directory (docs/architecture.md, "Files a run writes") holds ``config.json``, ``samples.jsonl`` (a line per prompt),
``rounds.jsonl`` (a line per round) and ``summary.json``. Decoding appends a prompt's rounds, then
its sample, as soon as it finishes; a rerun of the same command skips prompts already in
``samples.jsonl``, so a killed run loses at most the prompt in flight.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..engine.decode import DecodeConfig, Job
from ..engine.metrics import PromptResult, summarize
from ..engine.models.config import ModelConfig, model_defaults, with_defaults
from ..engine.policy import PolicyConfig, Sampling
from ..engine.settings import Settings
from ..engine.runtime import machine, machine_id
from ..files import DirLock, FileError, check_writable_dir, read_json, write_json, write_jsonl
from .rundir import CONFIG, ROUNDS, SAMPLES, SUMMARY, RoundRow, append_prompt, read_rounds, resume_state


@dataclass(frozen=True)
class RunConfig:
    task: str
    policy: PolicyConfig
    decode: DecodeConfig
    models: ModelConfig = field(default_factory=ModelConfig)
    limit: int | None = None
    ids: tuple[str, ...] | None = None
    score: bool = True
    predictor: str | None = None
    #: completions per prompt (pass@k), each with its own random numbers; needs sampling
    samples_per_prompt: int = 1
    #: sequences decoded side by side (:func:`vskip.engine.decode.decode_many`); each prompt's
    #: output is batch 1's, up to floating-point near-ties
    batch_size: int = 1
    #: the checked settings of the fields above (:meth:`of` hands over those the command line
    #: checked; otherwise they are built, and so checked, here); never written to ``config.json``
    settings: Settings | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.settings is None:
            object.__setattr__(self, "settings", Settings(self.policy, self.decode, self.models, self.predictor))
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.samples_per_prompt < 1:
            raise ValueError(f"--samples-per-prompt must be >= 1, got {self.samples_per_prompt}")
        if self.samples_per_prompt > 1 and self.decode.sampling.greedy:
            raise ValueError("--samples-per-prompt > 1 needs --temperature > 0 (greedy completions are all the same)")

    @classmethod
    def of(cls, settings: Settings, task: str, **kw) -> "RunConfig":
        """A run of checked ``settings`` on ``task`` (``kw``: limit, ids, score, samples_per_prompt)."""
        return cls(task=task, policy=settings.policy, decode=settings.decode, models=settings.models,
                   predictor=settings.predictor, settings=settings, **kw)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("settings")
        d["policy"]["guards"] = asdict(self.policy.guards)
        return d


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("vskip", "torch", "transformers", "numpy", "safetensors"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _check_resume(out: Path, cfg_json: dict) -> None:
    p = out / CONFIG
    if not p.exists():
        theirs = [name for name in (SAMPLES, ROUNDS, SUMMARY) if (out / name).exists()]
        if theirs:  # not a run directory vskip wrote: never adopt (and rewrite) someone's files
            raise FileError(f"{out} holds {', '.join(theirs)} but no {CONFIG} of a vskip run; choose another --out")
        return
    old = read_json(p, "run configuration")
    run = old.get("run") if isinstance(old, dict) else None
    if isinstance(run, dict) and isinstance(run.get("models"), dict):  # written before a model field existed
        run = {**run, "models": with_defaults(run["models"], model_defaults())}
    if isinstance(run, dict) and isinstance(run.get("decode"), dict):  # written before sampling existed
        run = {**run, "decode": with_defaults(run["decode"], {"sampling": asdict(Sampling())})}
    if isinstance(run, dict):
        run = with_defaults(run, {"samples_per_prompt": 1, "batch_size": 1})
    if run != cfg_json:
        raise ValueError(f"{out} holds a run with another configuration; choose another --out or remove it")


def run(cfg: RunConfig, out: Path, progress: bool = True, pair=None, command: str | None = None) -> dict:
    """Decode, score and summarise; returns the summary. ``pair``: an already loaded
    :class:`vskip.engine.models.load.ModelPair` matching ``cfg.models`` (sweeps reuse one per process).
    ``command``: the command line that started the run, recorded in ``config.json`` (reports show
    it instead of rebuilding one). The run directory is locked while it runs: a second writer
    refuses."""
    from ..bench import tasks

    problems = tasks.load_task(cfg.task, limit=cfg.limit, ids=list(cfg.ids) if cfg.ids else None)
    if not problems:
        raise ValueError(f"no prompts selected from {cfg.task}")
    if cfg.score:
        check_sandbox(cfg.task)
    out = check_writable_dir(out, "run directory")
    with DirLock(out, "run directory"):
        return _run_locked(cfg, out, problems, progress, pair, command)


def _run_locked(cfg: RunConfig, out: Path, problems, progress: bool, pair, command: str | None = None) -> dict:
    cfg_json = json.loads(json.dumps(cfg.to_json()))  # tuples become lists, as when read back
    _check_resume(out, cfg_json)
    done, _ = resume_state(out)

    m = cfg.models
    decoder = _models(cfg, problems, pair)
    pair, runtime = decoder.pair, decoder.runtime
    host = machine(runtime)
    lam = None
    if decoder.predictor is not None:
        from .predictor import threshold_record  # noqa: PLC0415 - optional component

        lam = threshold_record(decoder.predictor, cfg.policy.alpha)
    write_json(out / CONFIG, {"run": cfg_json, "models": pair.identity, "runtime": asdict(runtime),
                              "machine": host, "versions": package_versions(),
                              **({"thresholds": lam} if lam else {}),
                              **({"command": command} if command else {})})
    _decode_prompts(cfg, out, problems, decoder, done, progress, machine_id(host))
    samples = [done[(p.task_id, i)] for p in problems for i in range(cfg.samples_per_prompt)]
    scoring_note = None
    if cfg.score:
        scoring_note = score_samples(cfg.task, problems, samples, progress)
    rounds = read_rounds(out / ROUNDS)  # written once, in the order the completions finished
    # now with each completion's test result, in the order the completions were appended (a batch
    # finishes them out of prompt order), which is the order of their rounds: a resume pairs them
    write_jsonl(out / SAMPLES, list(done.values()))
    dcfg = cfg.decode
    summary = {"task": cfg.task, "policy": cfg.policy.name, **cfg.policy.summary(),
               "gamma": dcfg.gamma, "gamma_max": dcfg.gamma_max, "steps": m.steps, "verifier_cache": m.verifier_cache,
               "verifier_dtype": runtime.dtype, "drafter_dtype": runtime.drafter_dtype,
               "sandbox": scoring_note, **summarize(samples, rounds)}
    write_json(out / SUMMARY, summary)
    return summary


def _models(cfg: RunConfig, problems, pair):
    """The run's decode, opened through the door (:func:`vskip.engine.door.open_decoder`): the prompts
    fit before the models load; a pair already loaded (sweeps) is used as it is."""
    from ..bench import tasks
    from ..engine.door import open_decoder
    from .predictor import policy_predictor

    prompts = [(p.task_id, tasks.user_prompt(p)) for p in problems]
    return open_decoder(cfg.settings, prompts, pair=pair, record=json.loads(json.dumps(cfg.to_json())),
                        batch_size=cfg.batch_size, predictors=policy_predictor)


def _decode_prompts(cfg: RunConfig, out: Path, problems, decoder, done: dict, progress: bool,
                    host: str | None = None) -> None:
    """Decode every prompt not yet ``done``, appending each as it finishes
    (:func:`vskip.study.rundir.append_prompt`). A sample names the ``machine`` its clocks were read
    on, since a resumed run may finish elsewhere."""
    from tqdm import tqdm

    from ..bench.tasks import encode_problem

    pair = decoder.pair
    prompts = {p.task_id: encode_problem(pair.tokenizer, p) for p in problems}
    n = cfg.samples_per_prompt
    todo = [(p, i) for p in problems for i in range(n) if (p.task_id, i) not in done]
    if todo:
        decoder.warmup(prompts[todo[0][0].task_id])
    bar = tqdm(total=len(todo), desc=f"{cfg.task} {cfg.policy.name}", unit="prompt" if n == 1 else "sample",
               disable=not progress, file=sys.stderr)
    tok_total = sec_total = 0.0
    by_job = {}
    jobs = []
    for p, i in todo:
        job = Job(prompts[p.task_id], task_id=p.task_id, sample=i)
        by_job[id(job)] = (p, i)
        jobs.append(job)
    for job, res in decoder.decode_many(jobs, cfg.batch_size):  # in the order they finish
        p, i = by_job[id(job)]
        which = {"task_id": p.task_id, **({"sample": i} if n > 1 else {})}
        rounds = [RoundRow.of(r, p.task_id, i if n > 1 else None) for r in res.rounds]
        sample = {
            **which, "completion": pair.tokenizer.decode(res.tokens, skip_special_tokens=True),
            "passed": None, **PromptResult.of(res).to_json(), "stop": res.stop,
            "prompt_tokens": len(prompts[p.task_id]), "tokens": res.tokens, "rounds": len(rounds), "machine": host,
        }
        if res.traces:
            from .traces import append_traces  # noqa: PLC0415 - only for --trace runs

            append_traces(out, p.task_id, res.traces)
        append_prompt(out, rounds, sample)
        done[(p.task_id, i)] = sample
        tok_total += res.generated_tokens
        sec_total += res.decode_seconds
        bar.update(1)
        bar.set_postfix(tok_s=f"{tok_total / max(sec_total, 1e-9):.1f}")
    bar.close()


def check_sandbox(task: str) -> None:
    """Before any decoding: scoring a code task needs a sandbox that isolates (or an explicit
    VSKIP_SANDBOX=rlimits)."""
    from ..bench.scoring import CODE_TASKS

    if task in CODE_TASKS:
        from ..bench.sandbox import check_isolation
        from ..environment import sandbox_preference

        check_isolation(sandbox_preference())


def score_samples(task: str, problems, samples: list[dict], progress: bool = True) -> str | None:
    """Fill ``passed`` of each sample by execution in the sandbox; returns the sandbox kind."""
    from ..bench import scoring

    by_id = {p.task_id: p for p in problems}
    todo = [s for s in samples if s.get("passed") is None]
    if todo:
        results = scoring.score_many([by_id[s["task_id"]] for s in todo], [s["completion"] for s in todo], progress=progress)
        for s, r in zip(todo, results):
            s["passed"] = bool(r.passed)
    from ..bench.sandbox import sandbox_kind
    from ..environment import sandbox_preference

    return sandbox_kind(sandbox_preference())
