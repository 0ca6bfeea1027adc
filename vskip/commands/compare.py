"""``vskip compare``: several configurations on the same prompts, paired per prompt against ``ar``."""

from __future__ import annotations

from pathlib import Path

from .flags import add_batch_flag, add_policy_flags, add_task_flag, decode_config, settings, task_ids, with_preset


def register(subparsers) -> None:
    c = subparsers.add_parser("compare", help="decode the same prompts with several configurations, paired per prompt, "
                                       "and print their speed against ar")
    add_task_flag(c, default="humaneval", help="the benchmark whose prompts to decode (default: humaneval)")
    c.add_argument("--limit", type=int, help="first N prompts")
    c.add_argument("--ids", help="comma-separated task ids")
    c.add_argument("--configs", default=None,
                   help="comma-separated: ar, a policy name with this command's settings (its --preset's shape: "
                        "Strict SDD by default in the fastest lossless shape measured), POLICY+key=value+... "
                        "(keys: gamma, gamma_max, min_match, trim, steps, drafts; the policy's own: eta_b, eta_c, eta_m, "
                        "epsilon, k_min, s_max, lenience, top_k, period, period_k, lam, cost_ratio, alpha, "
                        "survival; cache=on|off for the verifier's KV cache; speculative=on|off for the standard "
                        "rule of speculative sampling (with --temperature); predictor=DIR for a learned signal's own "
                        "model instead of --predictor's), default (Strict SDD with "
                        "the standalone drafter in the default preset's shape, whatever --preset), drafted (the same "
                        "drafting every round, the default before its rounds chose their drafts), fast (drafted "
                        "with trimming at 0.5, the opt-in shape before the default took one of its kind), hf, "
                        "lookupN; "
                        "drafter=NAME|DIR: this configuration's own drafter; paper (Strict SDD in the paper's shape: "
                        "the standalone drafter, gamma 32, two reveal steps); llamacpp (llama.cpp's greedy "
                        "decode of the embedded verifier's GGUF file, llama-server built by scripts/llamacpp.sh), "
                        "llamacpp-MODE (its speculative modes without a draft model: ngram-simple, ngram-mod, "
                        "ngram-map-k, ngram-map-k4v, ngram-cache) (default: ar,strict,paper, and llamacpp where "
                        "llama.cpp is built, the verifier is the embedded one and the decode is greedy at batch 1)")
    c.add_argument("--repeats", type=int, default=1,
                   help="decode every prompt this many times with every configuration, in rotating order; the "
                        "summary gives each repeat's ratio to ar (default: 1)")
    c.add_argument("--out", help="keep the rows here (resumable; shards of several processes add up)")
    c.add_argument("--summary", action="store_true", help="only summarise the rows already in --out (no model)")
    c.add_argument("--score", action="store_true",
                   help="also run each configuration's outputs against the task's tests in the sandbox and give "
                        "pass@1, paired with ar's (kept in OUT/scores.json; with --summary, scores the rows there)")
    c.add_argument("--shard", default="1/1", help="I/N: this process takes prompts I, I+N, ... (default: 1/1)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    add_batch_flag(c)
    add_policy_flags(c, policy=False)
    c.set_defaults(fn=cmd_compare)


def cmd_compare(a) -> int:
    from ..bench import tasks
    from ..study import compare, runner, variants

    from ..files import check_writable_dir

    if a.summary:
        if not a.out or not Path(a.out).is_dir():
            raise ValueError("--summary needs --out DIR holding a comparison's rows")
        from ..files import DirLock

        check_writable_dir(a.out, "comparison directory")
        if a.score:
            runner.check_sandbox(compare.settings_task(Path(a.out)))
        with DirLock(Path(a.out), "comparison directory"):
            return _print_comparison(Path(a.out), None, score=a.score, progress=not a.quiet)
    if a.out is not None:
        check_writable_dir(a.out, "comparison directory")
    if a.score:
        runner.check_sandbox(a.task)
    if a.limit is not None and a.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {a.limit}")
    try:
        shard = tuple(int(x) for x in a.shard.split("/"))
        assert len(shard) == 2 and 1 <= shard[0] <= shard[1]
    except (ValueError, AssertionError):
        raise ValueError(f"--shard must be I/N with 1 <= I <= N, got {a.shard!r}") from None
    if a.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {a.repeats}")
    base = settings(a, "strict")
    dec, models = base.decode, base.models
    flags = {k: getattr(a, k) for k in variants.POLICY_FLAGS if getattr(a, k, None) is not None}

    def start(policy: str):  # the preset shapes Strict SDD and the skipping methods apart
        return decode_config(with_preset(a, policy))

    if a.configs is None:
        a.configs = default_configs(a, dec)
    variants = [variants.parse_variant(s, start, models.steps, a.predictor, flags) for s in a.configs.split(",")
                if s.strip()]
    if a.predictor and not Path(a.predictor).is_dir():
        raise ValueError(f"--predictor {a.predictor} is not a directory")
    for v in variants:
        if v.predictor and not Path(v.predictor).is_dir():
            raise ValueError(f"{v.name}: predictor {v.predictor} is not a directory")
        v.settings(models, a.predictor)  # every configuration's settings checked before any model loads
    if models.runtime == "auto" and any(v.hf and not v.engine for v in variants):
        from dataclasses import replace

        models = replace(models, runtime="transformers")  # hf and lookupN run transformers' generate on its model
    if any(v.engine for v in variants):  # before any model loads
        from ..study.llamacpp import check_available

        check_available([v.name for v in variants if v.engine], a.verifier)
    if not any(v.name == "ar" for v in variants):
        raise ValueError("--configs must include ar, the reference every configuration is measured against")
    compare.check_batch(variants, a.batch_size)
    ids = task_ids(a.ids)
    problems = tasks.load_task(a.task, limit=a.limit, ids=list(ids) if ids else None)
    if not problems:
        raise ValueError(f"no prompts selected from {a.task}")
    if not problems[shard[0] - 1 :: shard[1]]:  # more shards than prompts: nothing to do here
        print(f"shard {shard[0]}/{shard[1]} has no prompts of the {len(problems)} selected")
        return 0
    from ..engine.door import longest_prompt, runtime_of

    runtime = runtime_of(models)
    n = longest_prompt(models, [(p.task_id, tasks.user_prompt(p)) for p in problems], dec.max_new_tokens)
    import contextlib

    from ..files import DirLock

    lock = contextlib.nullcontext()
    if a.out:  # before any model loads: one writer per shard file, and no rows made otherwise
        lock = DirLock(Path(a.out), f"shard {shard[0]}/{shard[1]} of the comparison in", name=f".lock-shard-{shard[0]}-of-{shard[1]}")
        with DirLock(Path(a.out), "comparison directory", wait=True):  # settings.json: read, merge, write
            compare.claim(Path(a.out), compare.settings_record(a.task, dec.max_new_tokens, runtime, models, variants,
                                                               a.predictor, a.batch_size))
    with lock:
        return _decode_and_print(a, compare, tasks, models, dec, variants, runtime, problems, shard, n)


def _verifier_name(runtime) -> str:
    from ..engine.runtime import runtime_name

    return f"{runtime_name(runtime)} (int8 kernels on the GGUF blocks)" if runtime.verifier_runtime == "native" \
        else runtime.dtype


def _drafter_name(runtime) -> str:
    native = runtime.verifier_runtime == "native" and runtime.drafter_on == "cpu"
    return "native (Q8_0 blocks)" if native else runtime.drafter_dtype


def default_configs(a, dec) -> str:
    """``ar,strict,paper``, and ``llamacpp`` (llama.cpp's greedy decode) where it is built, the
    verifier is the embedded one, and the decode is greedy, one prompt at a time."""
    from ..engine.models.embedded import EMBEDDED_VERIFIER
    from ..study import llamacpp

    llama = (a.verifier in (None, "", "default", EMBEDDED_VERIFIER) and a.batch_size == 1 and dec.sampling.greedy
             and llamacpp.server_binary() is not None)
    return "ar,strict,paper" + (",llamacpp" if llama else "")


def _decode_and_print(a, compare, tasks, models, dec, variants, runtime, problems, shard, n) -> int:
    import tempfile

    from ..bench.tasks import encode_problem
    from ..engine.door import open_models

    # the longest block the command's drafter drafts (a configuration with a drafter of its own is
    # checked against that drafter when it decodes)
    gamma = max([dec.blocks.longest] + [v.decode.blocks.longest for v in variants
                                        if v.decode is not None and not v.drafter])
    pair = open_models(models, any(v.policy not in (None, "ar") for v in variants),
                       (n, dec.max_new_tokens, gamma, a.batch_size), runtime)
    from ..engine.models.embedded import EMBEDDED_DRAFTER
    from ..engine.models.load import drafter_beside

    loaded = models.drafter or EMBEDDED_DRAFTER
    for name in sorted({v.drafter for v in variants if v.drafter} - {loaded}):
        pair.extra_drafters[name] = drafter_beside(pair, name, models)
    prompts = [(p.task_id, encode_problem(pair.tokenizer, p)) for p in problems]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        compare.run_compare(prompts, pair, variants, out, shard, dec.max_new_tokens, progress=not a.quiet,
                            repeats=a.repeats, predictor=a.predictor, models=models, batch_size=a.batch_size)
        batched = f", {a.batch_size} prompts side by side" if a.batch_size != 1 else ""
        return _print_comparison(out, Path(a.out) if a.out else None,
                                 f"{a.task}, {dec.max_new_tokens} new tokens at most{batched}, verifier "
                                 f"{_verifier_name(runtime)}, drafter {_drafter_name(runtime)}{_sampled(dec.sampling)}", a.score,
                                 not a.quiet)


def _sampled(s) -> str:
    if s.greedy:
        return ""
    return (f", sampled at temperature {s.temperature:g} (top-p {s.top_p:g}, top-k {s.top_k or 'all'}, seed {s.seed}; "
            "Strict SDD draws ar's tokens)")


def _print_comparison(rows_dir, out, what: str | None = None, score: bool = False, progress: bool = True) -> int:
    from ..study import compare, compare_summary

    rows = compare_summary.rows_of(rows_dir)
    scores = compare.score_outputs(rows_dir, rows, progress) if score else None
    if scores is None and (rows_dir / compare.SCORES).exists():  # scored before: the summary keeps its pass@1
        from ..files import read_json

        scores = read_json(rows_dir / compare.SCORES, "comparison scores")
    s = compare_summary.summarize_comparison(rows, scores)
    text = compare_summary.format_summary(s)
    print(f"{s['n_prompts']} prompts{' of ' + what if what else ''}; ar is the verifier alone, paired per prompt; "
          f"= ar counts outputs identical to it")
    print(text)  # the table, ending with the line that names the machine
    if out is None and what is None:
        out = rows_dir
    if out is not None:
        from ..files import write_atomic, write_json

        write_json(out / "summary.json", s)
        write_atomic(out / "summary.md", text + "\n")
    return 0
