"""``vskip compare``: decoders side by side on the same prompts, paired per prompt.

Every prompt is decoded by every configuration, one after the other, in an order that rotates
from prompt to prompt, so machine drift falls on all configurations alike. With ``--batch-size B``
the prompts go in groups of B: each configuration, ``ar`` included, decodes a group side by side
(:func:`vskip.engine.decode.decode_many`), and the order rotates from group to group. ``ar`` (the
verifier's own greedy decoding through vskip's verifier runtime) is the reference every other
configuration is measured and checked against. Configurations (``--configs``):

- a policy name (``strict``, ``raw``, ...) with the command's settings, or with some of them
  changed: ``strict+gamma=4+gamma_max=16+min_match=6+trim=0.5+steps=2`` (block length per
  round and trimming: :mod:`vskip.engine.policy.blocks`; ``steps``: reveal steps of the drafter), the
  policy's own parameters (``raw+eta_b=0.7+eta_c=0.7+k_min=3``, ``prefix+lam=0.7``; a learned
  signal, ``marginal+eta_m=0.9`` or ``prefix+survival=model+alpha=0.05``, reads ``--predictor``),
  ``cache=off`` (the verifier recomputes the whole sequence every call, as the paper timed it), and
  ``predictor=DIR`` (this configuration's trained predictor instead of ``--predictor``, so that two
  models, say two on-policy rounds, are timed side by side; a DIR with ``+``, ``=`` or ``,`` cannot
  be named here);
- ``default``: Strict SDD in the default preset's shape, whatever the command's preset (short base
  blocks, long ones after a copy match, only the confident prefix verified;
  :data:`~vskip.study.variants.DEFAULT`); ``fast``: the same with trimming at 0.5, the opt-in
  shape before the default took one of its kind (:data:`~vskip.study.variants.FAST`);
- ``paper``: Strict SDD in the paper's shape (gamma 32, two reveal steps; :data:`~vskip.study.variants.PAPER`);
- ``hf``: transformers' greedy ``generate`` on the same model object;
- ``lookupN``: transformers' prompt-lookup assisted generation with ``prompt_lookup_num_tokens=N``.

Rows go to ``OUT/shard-I-of-N.jsonl``, one per (prompt, configuration, repeat), so several
processes (``--shard I/N``) can split the prompts and a killed comparison resumes. With
``--repeats R`` every prompt is decoded R times by every configuration, the order rotating again at
each repeat; the summary pools the repeats and gives each repeat's ratio, their spread. It gives
tokens/s as ΣN/ΣT, the ratio to ``ar`` with a 95% bootstrap interval over prompts, how many
outputs equal ``ar`` and where the others first differ, tokens per verifier call, c_D/c_V and
the share of decode time outside model forwards.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ..defaults import MAX_NEW_TOKENS
from ..engine.metrics import PromptResult
from ..engine.models.config import ModelConfig
from ..files import FileError, naming, open_append, own_dir, read_json, read_jsonl_lines, write_atomic, write_jsonl
from .variants import Variant

SETTINGS = "settings.json"


@dataclass(frozen=True)
class CompareRow:
    """One line of a shard file: a prompt decoded by one configuration in one repeat. Its measures
    are a :class:`vskip.engine.metrics.PromptResult`, the record ``samples.jsonl`` holds too, and
    ``tokens`` are the output's ids, as there. ``accepted`` (the draft tokens each verified round
    accepted) and ``agreement`` (the sums of Eqs. 1-2, :func:`vskip.engine.metrics.agreement_sums`)
    come from decodes through the loop. A field a row lacks is None (``repeat``: 0)."""

    task_id: str
    config: str
    result: PromptResult
    repeat: int = 0
    machine: str | None = None
    prompt_tokens: int | None = None
    digest: str | None = None
    tokens: list[int] | None = None
    accepted: list[int] | None = None
    agreement: list[int] | None = None

    @classmethod
    def from_json(cls, d: dict) -> "CompareRow":
        d = _renamed(d)
        return cls(task_id=d["task_id"], config=d["config"], result=PromptResult.from_json(d),
                   repeat=d.get("repeat", 0), machine=d.get("machine"), prompt_tokens=d.get("prompt_tokens"),
                   digest=d.get("digest"), tokens=d.get("tokens"), accepted=d.get("accepted"),
                   agreement=d.get("agreement"))

    def to_json(self) -> dict:
        head = {"task_id": self.task_id, "config": self.config, "repeat": self.repeat, "machine": self.machine,
                "prompt_tokens": self.prompt_tokens}
        tail = {"accepted": self.accepted, "agreement": self.agreement, "digest": self.digest, "tokens": self.tokens}
        return ({k: v for k, v in head.items() if v is not None} | self.result.to_json()
                | {k: v for k, v in tail.items() if v is not None})


#: what the rows of ``vskip compare`` named their fields before they shared :class:`PromptResult`
#: with ``vskip run`` (``tokens`` was the count, ``output`` the ids); read, never written
_OLD_NAMES = {"seconds": "decode_seconds", "calls": "verifier_calls", "blocks": "draft_blocks",
              "skipped": "skipped_rounds", "tokens": "generated_tokens", "output": "tokens"}


def _renamed(d: dict) -> dict:
    """A row in the record's vocabulary: rows written before it (no ``generated_tokens``) renamed."""
    if "generated_tokens" in d:
        return d
    return {_OLD_NAMES.get(k, k): v for k, v in d.items()}


def _digest(tokens) -> str:
    import hashlib

    return hashlib.sha256(json.dumps([int(t) for t in tokens]).encode()).hexdigest()[:16]


def _hf_generate(pair, ids, max_new: int, lookup: int | None, sampling: dict | None = None, key: int = 0):
    """transformers' ``generate`` (greedy, or sampling with ``sampling``'s settings, seeded from
    its seed and the prompt's ``key``) on the verifier's model: (tokens, seconds)."""
    import torch

    from ..engine.runtime import now

    if getattr(pair.verifier, "model", None) is None:
        raise ValueError("the hf and lookupN configurations run transformers' generate on the verifier's model; "
                         "give --runtime transformers")
    x = torch.tensor([ids], device=pair.verifier.device)
    eos = sorted(pair.verifier.eos_ids)
    kw = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    if sampling:
        kw |= {"do_sample": True, "temperature": sampling["temperature"], "top_p": sampling["top_p"],
               "top_k": sampling["top_k"]}  # top_k 0: no cut (the model's own default would be 50)
        torch.manual_seed((int(sampling["seed"]) * 1_000_003 + key) % 2**63)
    else:
        kw["do_sample"] = False
    t = now()
    with torch.inference_mode():
        out = pair.verifier.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new,
                                           eos_token_id=eos, pad_token_id=eos[0], **kw)
    return out[0, len(ids):].tolist(), now() - t




def settings_record(task: str, max_new: int, runtime, models, variants, predictor: str | None = None,
                    batch_size: int = 1) -> dict:
    """What rows of a comparison directory depend on: the settings every configuration shares
    (``fixed``, with the prompts decoded side by side, ``batch_size``) and each configuration's own."""
    from dataclasses import asdict

    from ..environment import llamacpp_isa

    level = llamacpp_isa()  # the llama.cpp build server_binary() finds
    configs = {v.name: {"policy": v.policy, "lookup": v.lookup, "steps": v.steps,
                        "decode": asdict(v.decode) if v.decode is not None else None,
                        **({"params": dict(v.params)} if v.params else {}),
                        **({"cache": v.cache} if v.cache is not None else {}),
                        **({"predictor": v.predictor} if v.predictor else {}),
                        **({"drafter": v.drafter} if v.drafter else {}),
                        **({"engine": v.engine} if v.engine else {}),
                        **({"llamacpp_isa": level} if v.engine == "llamacpp" and level != "native" else {})}
               for v in variants}
    return {"fixed": {"task": task, "max_new_tokens": max_new, "runtime": asdict(runtime), "models": asdict(models),
                      **({"predictor": str(predictor)} if predictor else {}), "batch_size": batch_size},
            "configs": configs}


def _fill_placement(fixed: dict) -> dict:
    """Settings written before the placement fields (or the batch size) existed, with their
    defaults filled in."""
    from ..engine.models.config import PLACEMENT_FIELDS, model_defaults, with_defaults

    if not isinstance(fixed, dict):
        return fixed
    fixed = {"batch_size": 1} | fixed
    if isinstance(fixed.get("models"), dict):
        fixed["models"] = with_defaults(fixed["models"], model_defaults())
    if isinstance(fixed.get("runtime"), dict):
        fixed["runtime"] = with_defaults(fixed["runtime"], {k: None for k in PLACEMENT_FIELDS}
                                         | {"verifier_runtime": "transformers"})  # before the native runtime
    return fixed


def claim(out: Path, record: dict) -> None:
    """Record ``record`` in ``out/settings.json``, refusing when rows already there were made with
    other settings (a configuration of the same name, or anything they share, differs): a rerun
    resumes or adds configurations, never mixes."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a directory")
    path = out / SETTINGS
    if path.exists():
        try:
            old = json.loads(path.read_text())
            old_fixed, old_configs = old["fixed"], old["configs"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{path} is not a comparison's settings file; choose another --out") from None
        new = json.loads(json.dumps(record))  # tuples become lists, as when read back
        old_fixed = _fill_placement(old_fixed)
        if old_fixed != new["fixed"]:
            keys = sorted(k for k in new["fixed"] if old_fixed.get(k) != new["fixed"][k])
            raise ValueError(f"{out} holds a comparison with other settings ({', '.join(keys)}); choose another --out")
        clash = sorted(k for k, v in new["configs"].items() if k in old_configs and old_configs[k] != v)
        if clash:
            raise ValueError(f"{out} holds configurations of the same name with other settings: {', '.join(clash)}")
        record = {"fixed": new["fixed"], "configs": old_configs | new["configs"]}
    own_dir(out)
    write_atomic(path, json.dumps(record, indent=1))


def check_batch(variants, batch_size: int) -> None:
    """Refuse ``--batch-size`` above 1 with transformers' or llama.cpp's decoders (``hf``,
    ``lookupN``, ``llamacpp``): they decode one prompt at a time here, and their clocks would be
    set against batched ones."""
    hf = [v.name for v in variants if v.hf]
    if batch_size != 1 and hf:
        raise ValueError(f"--batch-size {batch_size}: {', '.join(hf)} decode{'s' if len(hf) == 1 else ''} "
                         "one prompt at a time, and cannot be timed against batched "
                         "configurations; give --batch-size 1 or leave them out of --configs")


def _decode_rows(pair, v: Variant, todo, predictor=None, batch_size: int = 1, chooser=None):
    """Decode ``todo`` [(task_id, ids)] with ``v``, ``batch_size`` side by side through one loop
    (:func:`vskip.engine.decode.decode_many`); yields (task_id, the fields of a CompareRow a decode
    fills, tokens) as each prompt finishes. ``chooser``: the configuration's chooser of payoff
    drafts, kept from group to group as a decoder keeps it from prompt to prompt."""
    from ..engine.decode import Job, decode_many
    from ..engine.metrics import agreement_sums

    drafter = pair.extra_drafters.get(v.drafter, pair.drafter) if v.drafter else pair.drafter
    if drafter is not None and v.steps != drafter.steps:
        drafter = drafter.with_steps(v.steps)  # same model and prior, another number of reveal steps
    policy = v.policy_config()
    before = pair.verifier.use_cache
    if v.cache is not None:
        pair.verifier.set_cache(v.cache)
    try:
        jobs = [Job(ids, task_id=tid) for tid, ids in todo]
        for job, r in decode_many(jobs, drafter if policy.uses_drafter else None, pair.verifier, policy, v.decode,
                                  predictor, batch_size, chooser=chooser):
            row = {"result": PromptResult.of(r), "accepted": [x.accepted for x in r.rounds if x.verified and x.gamma],
                   "agreement": list(agreement_sums(r.rounds))}
            yield job.task_id, row, r.tokens
    finally:
        if v.cache is not None:
            pair.verifier.set_cache(before)


def _predictors(pair, variants, directory: str | None, models) -> dict:
    """The trained predictor of each learned variant, by variant name (the variant's own
    ``predictor=``, else ``directory``; each kind and directory read once), opened as every decode opens its predictor
    (:func:`vskip.study.predictor.policy_predictor`: checked against its online thresholds' settings)."""
    from .predictor import policy_predictor

    out, loaded = {}, {}
    for v in variants:
        s = v.settings(models, directory)
        if s is not None and s.policy.learned:
            out[v.name] = policy_predictor(s, pair.runtime, loaded=loaded)
    return out


def run_compare(prompts, pair, variants, out: Path, shard: tuple[int, int] = (1, 1), max_new: int = MAX_NEW_TOKENS,
                progress: bool = True, repeats: int = 1, predictor: str | None = None, models=None,
                batch_size: int = 1) -> Path:
    """Decode ``prompts`` [(task_id, ids)] (this shard's share) ``repeats`` times with every
    variant; returns the shard's row file. Rows already there are kept (resume). ``models``: the
    command's :class:`~vskip.engine.models.config.ModelConfig` (the variants' settings start from it).
    ``batch_size``: the shard's prompts go in groups of this many, and each configuration decodes a
    group side by side (:func:`vskip.engine.decode.decode_many`), the order of configurations
    rotating from group to group (one prompt a group: from prompt to prompt)."""
    from ..engine.decode import warmup
    from ..engine.runtime import machine, machine_id

    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    if batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
    check_batch(variants, batch_size)
    i, n = shard
    own_dir(out)
    path = out / f"shard-{i}-of-{n}.jsonl"
    kept = read_rows(path)
    done = {(r.task_id, r.config, r.repeat) for r in kept}
    # keep only whole rows, so that a line cut by a kill cannot swallow the next one
    write_jsonl(path, [r.to_json() for r in kept])
    mine = prompts[i - 1 :: n]
    host = machine_id(machine(pair.runtime))
    learned = _predictors(pair, variants, predictor, models or ModelConfig())
    if mine:
        extra = pair.extra_drafters
        for name, d in [(None, pair.drafter), *extra.items()]:  # each drafter with the longest block it drafts
            mine_v = [v for v in variants if not v.hf and (extra.get(v.drafter) is d if v.drafter in extra else name is None)]
            warmup(d, pair.verifier, mine[0][1], max((v.decode.blocks.longest for v in mine_v), default=1))
    groups = [mine[j : j + batch_size] for j in range(0, len(mine), batch_size)]
    n_ids = {tid: len(ids) for tid, ids in mine}
    engines = _Engines(pair, models or ModelConfig(), [v.engine for v in variants if v.engine])
    try:
        _compare_loop(path, groups, repeats, variants, done, pair, engines, max_new, learned, batch_size, host, n_ids,
                      progress, i, n, len(mine))
    finally:
        engines.close()
    return path


class _Engines:
    """llama.cpp's servers of a comparison, one per configuration, started before the first decode
    (their loading is not timed) and stopped at the end."""

    def __init__(self, pair, models, names):
        self.servers = {}
        if not names:
            return
        from ..engine.models.embedded import gguf_path
        from .llamacpp import LlamaServer, check_available, spec_of

        check_available(names, models.verifier)
        import torch

        self.eos = set(pair.verifier.eos_ids)
        threads = pair.runtime.threads or torch.get_num_threads()
        try:
            for name in dict.fromkeys(names):
                self.servers[name] = LlamaServer(gguf_path(), threads, spec_of(name))
        except BaseException:
            self.close()
            raise

    def complete(self, name, ids, max_new):
        """(tokens, seconds) of one greedy decode; a request the server leaves unanswered is
        retried once on a fresh server (seen once in a long comparison: both sides idle)."""
        try:
            tokens, seconds, _ = self.servers[name].complete(list(ids), max_new, self.eos, timeout=120.0)
        except TimeoutError as e:
            print(f"vskip: {name}: {e}; restarting it and retrying the prompt", file=sys.stderr)
            self.servers[name] = self.servers[name].restarted()
            tokens, seconds, _ = self.servers[name].complete(list(ids), max_new, self.eos, timeout=600.0)
        return tokens, seconds

    def close(self):
        for s in self.servers.values():
            s.close()


def _compare_loop(path, groups, repeats, variants, done, pair, engines, max_new, learned, batch_size, host, n_ids,
                  progress, i, n, total):
    """The comparison's decodes, group by group and repeat by repeat, configurations rotating;
    each row is appended to ``path`` as its prompt finishes."""
    from tqdm import tqdm

    from ..engine.chooser import chooser_for

    bar = tqdm(total=total, desc=f"compare {i}/{n}", unit="prompt", disable=not progress, file=sys.stderr)
    choosers = {v.name: chooser_for(pair.tokenizer) for v in variants if not v.hf and v.decode.drafts == "payoff"}
    with naming(path), open_append(path) as f:
        for k, group in enumerate(groups):
            for rep in range(repeats):
                first = (k * repeats + rep) % len(variants)
                for v in variants[first:] + variants[:first]:
                    todo = [(tid, ids) for tid, ids in group if (tid, v.name, rep) not in done]
                    if not todo:
                        continue
                    if v.hf:  # one prompt at a time (check_batch: batch size 1)
                        from ..engine.policy import prompt_key

                        rows = []
                        for tid, ids in todo:
                            if v.engine:
                                tokens, seconds = engines.complete(v.engine, ids, max_new)
                            else:
                                tokens, seconds = _hf_generate(pair, ids, max_new, v.lookup, dict(v.params) or None,
                                                               prompt_key(tid, ids))
                            rows.append((tid, {"result": PromptResult(generated_tokens=len(tokens),
                                                                      decode_seconds=seconds)}, tokens))
                    else:
                        rows = _decode_rows(pair, v, todo, learned.get(v.name), batch_size, choosers.get(v.name))
                    for tid, row, tokens in rows:  # as each prompt finishes
                        row = CompareRow(task_id=tid, config=v.name, repeat=rep, machine=host,
                                         prompt_tokens=n_ids[tid], digest=_digest(tokens),
                                         tokens=[int(t) for t in tokens], **row)
                        f.write(json.dumps(row.to_json()) + "\n")
                        f.flush()
            bar.update(len(group))
    bar.close()


def read_rows(path: Path) -> list[CompareRow]:
    """The whole rows of a shard file (``.jsonl``, or ``.jsonl.gz`` as archived); a last line cut
    by a kill is dropped, and its row is redone. A row whose measures cannot be right (no prompt or
    configuration, seconds not positive, counts negative) names its file and line."""
    rows = []
    for i, raw in read_jsonl_lines(path):
        _check_row(raw, path, i)
        rows.append(CompareRow.from_json(raw))
    return rows


def _check_row(raw: dict, path: Path, line: int) -> None:
    """Refuse a row whose measures cannot be right, naming its fields as the file spells them."""
    def bad(why: str):
        raise FileError(f"{path}: line {line} {why}; the comparison's rows are damaged")

    r = _renamed(raw)
    said = {v: k for k, v in _OLD_NAMES.items()} if r is not raw else {}
    if not isinstance(r.get("task_id"), str) or not isinstance(r.get("config"), str):
        bad("names no task_id or config")
    sec = r.get("decode_seconds")  # checked where present: rows made for their outputs alone carry no timing
    if "decode_seconds" in r and (isinstance(sec, bool) or not isinstance(sec, (int, float)) or not math.isfinite(sec)
                                  or sec <= 0):
        bad(f"has {said.get('decode_seconds', 'decode_seconds')} {sec!r} (a positive number is needed)")
    for key in ("generated_tokens", "verifier_calls", "draft_blocks", "skipped_rounds", "repeat"):
        v = r.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            bad(f"has {said.get(key, key)} {v!r} (a count is needed)")


#: configuration -> task id -> passed, written by ``vskip compare --score``
SCORES = "scores.json"


def settings_task(directory: Path) -> str:
    """The task a comparison directory's rows were decoded on (its ``settings.json``)."""
    from ..bench import tasks

    path = directory / SETTINGS
    task = ((read_json(path, "comparison settings") if path.exists() else {}).get("fixed") or {}).get("task")
    if task not in tasks.ALL_TASKS:
        raise ValueError(f"{path} names no task to score against")
    return task


def score_outputs(directory: Path, rows: list[CompareRow], progress: bool = True) -> dict[str, dict[str, bool]]:
    """Each configuration's outputs (first repeat) run against the task's tests in the sandbox:
    configuration -> task id -> passed, kept in ``directory/scores.json`` (a rerun scores only
    what is new). The outputs become text with the verifier's own tokenizer, as ``vskip run``
    writes its completions; the task and the verifier are those of the comparison's settings."""
    from transformers import AutoTokenizer

    from ..bench import scoring, tasks
    from ..engine.models.verifiers import resolve_verifier_dir

    task = settings_task(directory)
    fixed = read_json(directory / SETTINGS, "comparison settings")["fixed"]
    path = directory / SCORES
    scores = read_json(path, "comparison scores") if path.exists() else {}
    todo = [r for r in rows
            if r.repeat == 0 and r.tokens is not None and r.task_id not in scores.get(r.config, {})]
    if todo:
        vdir = resolve_verifier_dir((fixed.get("models") or {}).get("verifier"))
        tok = AutoTokenizer.from_pretrained(vdir, trust_remote_code=False, local_files_only=True)
        problems = {p.task_id: p for p in tasks.load_task(task, ids=sorted({r.task_id for r in todo}))}
        texts = [tok.decode(r.tokens, skip_special_tokens=True) for r in todo]
        results = scoring.score_many([problems[r.task_id] for r in todo], texts, progress=progress)
        for r, res in zip(todo, results):
            scores.setdefault(r.config, {})[r.task_id] = bool(res.passed)
        write_atomic(path, json.dumps(scores, indent=1, sort_keys=True))
    return scores
