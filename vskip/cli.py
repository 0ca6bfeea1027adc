"""The command line: a thin map from flags to configurations; the library does the work."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from .defaults import GAMMA, K_MIN, POLICIES, S_MAX, STEPS


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, no usage dump
        print(f"vskip: error: {message}", file=sys.stderr)
        sys.exit(2)


def _add_policy_flags(p: argparse.ArgumentParser, policy: bool = True) -> None:
    g = p.add_argument_group("policy")
    if policy:
        g.add_argument("--policy", default="raw", choices=POLICIES, help="decoding method (default: raw)")
    g.add_argument("--gamma", type=int, default=GAMMA, help=f"draft block length (default: {GAMMA}; the paper: 32)")
    g.add_argument("--steps", type=int, default=STEPS, help=f"diffusion steps per block (default: {STEPS}; the paper: 2)")
    add_block_flags(g)
    g.add_argument("--eta-b", type=float, help="local gate threshold (Eq. 3)")
    g.add_argument("--eta-c", type=float, help="prefix gate threshold (Eq. 3)")
    g.add_argument("--eta-m", type=float, help="marginal survival: both gates")
    g.add_argument("--epsilon", type=float, help="conditional survival: eta_c = 1 - epsilon")
    g.add_argument("--k-min", type=int, default=K_MIN, help=f"minimum skip length (default: {K_MIN})")
    g.add_argument("--s-max", type=int, default=S_MAX, help=f"staleness threshold (default: {S_MAX})")
    g.add_argument("--lenience", type=float, default=1.0, help="lenience l of Eq. 9 (default: 1)")
    g.add_argument("--top-k", type=int, default=1, help="top-k acceptance k (default: 1)")
    g.add_argument("--period", type=int, default=4, help="periodic baseline: skip every P rounds")
    g.add_argument("--period-k", type=int, default=6, help="periodic baseline: skip length (default: 6)")
    g.add_argument("--lam", type=float, default=0.9,
                   help="prefix policy (beyond the paper): the survival a skipped prefix must keep (default: 0.9)")
    g.add_argument("--cost-ratio", type=float,
                   help="prefix policy: c_D / c_V to weigh skips with (default: the costs measured in the run)")
    g.add_argument("--alpha", type=float,
                   help="prefix policy with a prefix model (--predictor): the share of committed tokens allowed to "
                        "differ from Strict SDD; each prompt takes the threshold its fold calibrated (overrides --lam)")
    g.add_argument("--shadow", action=argparse.BooleanOptionalAction, default=True, help="shadow-verify skipped rounds")
    g.add_argument("--max-new-tokens", type=int, default=512, help="output budget (default: 512)")
    g.add_argument("--predictor", help="directory of trained survival predictors (marginal/conditional; with "
                                       "--policy prefix: the prefix model, whose survival then replaces the "
                                       "confidences' product)")
    add_model_flags(p)


def add_block_flags(g) -> None:
    """Block length per round (beyond the paper; off unless --gamma-max is given)."""
    g.add_argument("--gamma-max", type=int,
                   help="draft a block of this length instead of --gamma when the drafter's copy hint matches at "
                        "least --min-match tokens or the previous block was accepted whole (default: off)")
    g.add_argument("--min-match", type=int, default=8, help="copy-hint match length that earns --gamma-max (default: 8)")
    g.add_argument("--trim", type=float,
                   help="verify only the leading drafted tokens with raw confidence >= TRIM (at least one; default: "
                        "the whole block). Lossless; traces need whole blocks")


def add_model_flags(p: argparse.ArgumentParser, threads_help: str = "torch CPU threads") -> None:
    """The model flags shared by every command that loads the pair (run, generate, sweep)."""
    m = p.add_argument_group("models")
    m.add_argument("--drafter", help="drafter directory (default: the embedded drafter)")
    m.add_argument("--verifier", help="verifier checkpoint directory (default: embedded SmolLM2-135M-Instruct)")
    m.add_argument("--copy-prior", default="auto", metavar="auto|off|PATH",
                   help="the drafter's copy prior: auto (the drafter's copy_prior.json if it has one), off, or a file")
    m.add_argument("--reveal", choices=("maskgit_plus", "topk_margin", "entropy"), help="reveal order (default: the drafter's)")
    m.add_argument("--verifier-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the verifier's KV cache (--no-verifier-cache recomputes every call, as the paper measured)")
    m.add_argument("--device", help="cpu, cuda or cuda:N: both models, unless placed apart (default: cuda when available)")
    m.add_argument("--drafter-device", metavar="DEVICE", help="the drafter's own device (default: --device)")
    m.add_argument("--verifier-device", metavar="DEVICE|STRATEGY",
                   help="the verifier's own device, or auto, balanced, balanced_low_0 or sequential to spread it over "
                        "several (accelerate's device_map; default: --device)")
    m.add_argument("--max-memory", metavar="DEV=SIZE,...",
                   help="what each device may hold, e.g. 0=40GiB,1=40GiB; a spread verifier uses these devices "
                        "(default: every visible GPU, all it has free)")
    m.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="the verifier's dtype (default: float32 on CPU, bfloat16 on CUDA); only float32 is lossless on CPU")
    m.add_argument("--drafter-dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="the drafter's dtype; it never changes what Strict SDD commits (default auto: bfloat16 where "
                        "the device runs it natively, else --dtype)")
    m.add_argument("--threads", type=int, help=threads_help)


def model_config(a):
    """The :class:`vskip.models.config.ModelConfig` of parsed model flags (``--steps`` included)."""
    from .models.config import ModelConfig

    return ModelConfig(drafter=a.drafter, verifier=a.verifier, steps=a.steps, reveal=a.reveal,
                       verifier_cache=a.verifier_cache, device=a.device, dtype=a.dtype, threads=a.threads,
                       copy_prior=a.copy_prior, drafter_dtype=a.drafter_dtype, drafter_device=a.drafter_device,
                       verifier_device=a.verifier_device, max_memory=a.max_memory)


def _configs(a, policy_name: str | None = None):
    from .decode import DecodeConfig
    from .policy import PolicyConfig

    policy = PolicyConfig.make(
        policy_name or a.policy, eta_b=a.eta_b, eta_c=a.eta_c, eta_m=a.eta_m, epsilon=a.epsilon, k_min=a.k_min, s_max=a.s_max,
        lenience=a.lenience, top_k=a.top_k, period=a.period, period_k=a.period_k, lam=a.lam,
        cost_ratio=a.cost_ratio, alpha=getattr(a, "alpha", None),
        survival="model" if (policy_name or a.policy) == "prefix" and getattr(a, "predictor", None) else "confidence",
    )
    dec = DecodeConfig(gamma=a.gamma, max_new_tokens=a.max_new_tokens, shadow=a.shadow, gamma_max=a.gamma_max,
                       min_match=a.min_match, trim=a.trim,
                       trace=getattr(a, "trace", False), task=getattr(a, "task", None))
    return policy, dec, model_config(a)


def _ids(text: str | None) -> tuple[str, ...] | None:
    """Task ids of ``--ids`` (None when not given); given but naming none is an error."""
    if text is None:
        return None
    ids = tuple(i.strip() for i in text.split(",") if i.strip())
    if not ids:
        raise ValueError(f"--ids names no task id: {text!r}")
    return ids


def cmd_run(a) -> int:
    from . import tasks
    from .runner import RunConfig, run

    if a.task not in tasks.ALL_TASKS:
        raise ValueError(f"unknown task {a.task!r}; expected one of {', '.join(tasks.ALL_TASKS)}")
    if a.limit is not None and a.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {a.limit}")
    policy, dec, models = _configs(a)
    ids = _ids(a.ids)
    cfg = RunConfig(task=a.task, policy=policy, decode=dec, models=models, limit=a.limit, ids=ids,
                    score=a.score, predictor=a.predictor)
    summary = run(cfg, a.out, progress=not a.quiet, command=getattr(a, "command_line", None))
    keys = ("task", "policy", "n_prompts", "pass_at_1", "tokens_per_s", "calls_per_token", "blocks_per_token",
            "strict_token", "full_prefix", "skipped_rounds")
    print(json.dumps({k: summary.get(k) for k in keys}))
    return 0


def cmd_generate(a) -> int:
    from .decode import decode, warmup
    from .models.load import open_pair
    from .prompting import encode_chat
    from .runtime import resolve_runtime

    if not a.prompt.strip():
        raise ValueError("the prompt is empty")
    policy, dec, models = _configs(a)
    runtime = resolve_runtime(models.device, models.dtype, models.threads, models.drafter_dtype,
                              models.drafter_device, models.verifier_device, models.max_memory)
    from .models.load import check_prompt_fits

    n = check_prompt_fits(models.verifier, a.prompt, dec.max_new_tokens)  # tokenizer only: before any model loads
    pair = open_pair(models, need_drafter=policy.uses_drafter, budget=(n, dec.max_new_tokens, dec.gamma))
    predictor = None
    if policy.learned:
        from .predictor import load_predictor, note_thresholds

        predictor = load_predictor(a.predictor, policy.predictor_kind, runtime)
        note_thresholds(predictor, policy.alpha)
    ids = encode_chat(pair.tokenizer, a.prompt)
    warmup(pair.drafter, pair.verifier, ids, dec.gamma)
    res = decode(ids, pair.drafter, pair.verifier, policy, dec, predictor)
    print(pair.tokenizer.decode(res.tokens, skip_special_tokens=True))
    n = res.generated_tokens
    print(
        f"policy={policy.name} tokens={n} seconds={res.decode_seconds:.3f} tok/s={n / max(res.decode_seconds, 1e-9):.2f} "
        f"verifier_calls={res.verifier_calls} draft_blocks={res.draft_blocks} skipped_rounds={res.skipped_rounds} "
        f"stop={res.stop}",
        file=sys.stderr,
    )
    return 0


def cmd_compare(a) -> int:
    import tempfile

    from . import compare, tasks
    from .models.load import open_pair
    from .prompting import encode_chat
    from .runtime import resolve_runtime

    if a.summary:
        if not a.out or not Path(a.out).is_dir():
            raise ValueError("--summary needs --out DIR holding a comparison's rows")
        return _print_comparison(compare, Path(a.out), None)
    if a.task not in tasks.ALL_TASKS:
        raise ValueError(f"unknown task {a.task!r}; expected one of {', '.join(tasks.ALL_TASKS)}")
    if a.limit is not None and a.limit < 1:
        raise ValueError(f"--limit must be >= 1, got {a.limit}")
    try:
        shard = tuple(int(x) for x in a.shard.split("/"))
        assert len(shard) == 2 and 1 <= shard[0] <= shard[1]
    except (ValueError, AssertionError):
        raise ValueError(f"--shard must be I/N with 1 <= I <= N, got {a.shard!r}") from None
    _, dec, models = _configs(a, "strict")
    variants = [compare.parse_variant(s, dec, models.steps) for s in a.configs.split(",") if s.strip()]
    if not any(v.name == "ar" for v in variants):
        raise ValueError("--configs must include ar, the reference every configuration is measured against")
    ids = _ids(a.ids)
    problems = tasks.load_task(a.task, limit=a.limit, ids=list(ids) if ids else None)
    if not problems:
        raise ValueError(f"no prompts selected from {a.task}")
    runtime = resolve_runtime(models.device, models.dtype, models.threads, models.drafter_dtype,
                              models.drafter_device, models.verifier_device, models.max_memory)
    from .models.load import check_prompt_fits

    n = check_prompt_fits(models.verifier, [(p.task_id, tasks.user_prompt(p)) for p in problems], dec.max_new_tokens)
    if a.out:  # before any model loads: refuse an --out whose rows were made otherwise
        compare.claim(Path(a.out), compare.settings_record(a.task, dec.max_new_tokens, runtime, models, variants))
    gamma = max([dec.gamma] + [v.decode.gamma_max or v.decode.gamma for v in variants if v.decode is not None])
    pair = open_pair(models, need_drafter=any(v.policy not in (None, "ar") for v in variants),
                     budget=(n, dec.max_new_tokens, gamma))
    prompts = [(p.task_id, encode_chat(pair.tokenizer, tasks.user_prompt(p))) for p in problems]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out) if a.out else Path(tmp)
        compare.run_compare(prompts, pair, variants, out, shard, dec.max_new_tokens, progress=not a.quiet)
        return _print_comparison(compare, out, Path(a.out) if a.out else None,
                                 f"{a.task}, {dec.max_new_tokens} new tokens at most, verifier {runtime.dtype}, "
                                 f"drafter {runtime.drafter_dtype}")


def _print_comparison(compare, rows_dir, out, what: str | None = None) -> int:
    s = compare.summarize_comparison(compare.rows_of(rows_dir))
    text = compare.format_summary(s)
    print(text)
    print(f"{s['n_prompts']} prompts{' of ' + what if what else ''}; ar is the verifier alone, paired per prompt; "
          f"= ar counts outputs identical to it")
    if out is None and what is None:
        out = rows_dir
    if out is not None:
        from .files import write_atomic, write_json

        write_json(out / "summary.json", s)
        write_atomic(out / "summary.md", text + "\n")
    return 0


def cmd_score(a) -> int:
    from .scoring import score_samples_file

    from .files import FileError, check_writable_dir, write_json

    if a.out:  # before scoring: results must not be lost to an unwritable --out
        if Path(a.out).is_dir():
            raise FileError(f"--out {a.out} is a directory; name a file")
        check_writable_dir(Path(a.out).parent or Path("."), "directory of --out")
    from .runner import _check_sandbox

    _check_sandbox(a.task)
    res = score_samples_file(a.task, a.samples)
    if a.out:
        write_json(a.out, res)
    print(f"{res['task']}: pass@1 = {res['pass_at_1']:.4f} ({sum(r['passed'] for r in res['results'])}/{res['n']}) sandbox={res['sandbox']}")
    return 0


def cmd_plan(a) -> int:
    from .files import write_atomic, write_json
    from .models.load import _drafter_dir, resolve_verifier_dir
    from .models.placement import plan_memory
    from .runtime import STRATEGIES, normalize_device, parse_max_memory

    vdir = resolve_verifier_dir(a.verifier)
    ddir = None if a.no_drafter else _drafter_dir(a.drafter)
    if ddir is not None and not ddir.exists():
        raise FileNotFoundError(f"drafter path {ddir} does not exist")
    for v, flag in ((a.prompt_tokens, "--prompt-tokens"), (a.max_new_tokens, "--max-new-tokens"), (a.gamma, "--gamma")):
        if v < 1:
            raise ValueError(f"{flag} must be >= 1, got {v}")
    device = a.device or "cuda:0"
    verifier_on = a.verifier_device or device
    if verifier_on not in STRATEGIES:
        verifier_on = normalize_device(verifier_on)
    drafter_on = normalize_device(a.drafter_device or device)
    gpu = verifier_on in STRATEGIES or verifier_on.startswith("cuda")
    dtype = a.dtype or ("bfloat16" if gpu else "float32")
    plan = plan_memory(vdir, ddir, verifier_device=verifier_on, drafter_device=drafter_on, dtype=dtype,
                       drafter_dtype=a.drafter_dtype or dtype, prompt_tokens=a.prompt_tokens,
                       max_new_tokens=a.max_new_tokens, gamma=a.gamma, verifier_cache=a.verifier_cache,
                       capacity=parse_max_memory(a.max_memory))
    text = plan.describe()
    print(text)
    if a.out:
        command = getattr(a, "command_line", None) or "vskip plan " + " ".join(sys.argv[2:])
        write_json(Path(a.out), {"command": command} | plan.to_json())
        write_atomic(Path(a.out).with_suffix(".md"), f"```\n{command}\n```\n\n{text}\n")
    return 0 if plan.fits else 1


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vskip", description="Speculative diffusion decoding with verifier skipping.",
                epilog="Errors print one line; --debug (anywhere) or VSKIP_DEBUG=1 prints the traceback.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="decode a task's prompts with one configuration and score them")
    r.add_argument("--task", required=True, help="humaneval, mbpp, mbpp_plus, math500 or gsm8k")
    r.add_argument("--limit", type=int, help="first N prompts")
    r.add_argument("--ids", help="comma-separated task ids")
    r.add_argument("--out", required=True, help="run directory (resumable)")
    r.add_argument("--score", action=argparse.BooleanOptionalAction, default=True, help="score by execution")
    r.add_argument("--trace", action="store_true", help="store the A.7 inputs of every block (for predictors)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_policy_flags(r)
    r.set_defaults(fn=cmd_run)

    g = sub.add_parser("generate", help="one completion to stdout, statistics to stderr")
    g.add_argument("prompt", help="the user message")
    _add_policy_flags(g)
    g.set_defaults(fn=cmd_generate)

    c = sub.add_parser("compare", help="decode the same prompts with several configurations, paired per prompt, "
                                       "and print their speed against ar")
    c.add_argument("--task", default="humaneval", help="humaneval, mbpp, mbpp_plus, math500 or gsm8k (default: humaneval)")
    c.add_argument("--limit", type=int, help="first N prompts")
    c.add_argument("--ids", help="comma-separated task ids")
    c.add_argument("--configs", default="ar,strict,fast",
                   help="comma-separated: ar, a policy name with this command's settings, POLICY+key=value+... "
                        "(keys: gamma, gamma_max, min_match, trim, steps), fast (Strict SDD with "
                        "--gamma 4 --gamma-max 16 --min-match 6 --trim 0.5), hf, lookupN (default: ar,strict,fast)")
    c.add_argument("--out", help="keep the rows here (resumable; shards of several processes add up)")
    c.add_argument("--summary", action="store_true", help="only summarise the rows already in --out (no model)")
    c.add_argument("--shard", default="1/1", help="I/N: this process takes prompts I, I+N, ... (default: 1/1)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_policy_flags(c, policy=False)
    c.set_defaults(fn=cmd_compare)

    s = sub.add_parser("score", help="score an EvalPlus-style samples file in the sandbox")
    s.add_argument("--task", required=True)
    s.add_argument("--samples", required=True, help="JSONL with task_id and completion (or solution)")
    s.add_argument("--out", help="write per-sample results as JSON here")
    s.set_defaults(fn=cmd_score)

    pl = sub.add_parser("plan", help="the memory each device needs for a pair and placement, from the configs alone",
                        description="Estimate, per device, the weights, key/value cache, activations and a CUDA reserve "
                                    "of a drafter/verifier pair placed as the flags say, without loading any weight, "
                                    "and say whether it fits. Plans for other machines with --max-memory. "
                                    "Exit status 0 when it fits, 1 when it does not.")
    pl.add_argument("--drafter", help="drafter directory (vskip drafter or Dream checkpoint; default: the embedded drafter)")
    pl.add_argument("--no-drafter", action="store_true", help="plan the verifier alone (ar)")
    pl.add_argument("--verifier", help="verifier checkpoint directory (config.json is enough)")
    pl.add_argument("--device", help="both models, unless placed apart (default: cuda:0)")
    pl.add_argument("--drafter-device", metavar="DEVICE")
    pl.add_argument("--verifier-device", metavar="DEVICE|STRATEGY",
                    help="a device, or auto, balanced, balanced_low_0 or sequential over the --max-memory devices")
    pl.add_argument("--max-memory", metavar="DEV=SIZE,...",
                    help="capacity of each device, e.g. 0=80GiB or 0=40GiB,1=40GiB (default: what is free here)")
    pl.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="the verifier's (default: bfloat16 on GPUs)")
    pl.add_argument("--drafter-dtype", choices=("float32", "bfloat16", "float16"), help="default: --dtype")
    pl.add_argument("--prompt-tokens", type=int, default=1024, help="longest prompt (default: 1024)")
    pl.add_argument("--max-new-tokens", type=int, default=512, help="output budget (default: 512)")
    pl.add_argument("--gamma", type=int, default=GAMMA, help=f"block length (default: {GAMMA}; the paper: 32)")
    pl.add_argument("--verifier-cache", action=argparse.BooleanOptionalAction, default=True,
                    help="--no-verifier-cache: the verifier recomputes the whole sequence every call (the paper)")
    pl.add_argument("--out", help="write the plan as JSON here (and the table beside it as .md)")
    pl.set_defaults(fn=cmd_plan, argv=None)

    from . import commands
    from .distill import cli as distill_cli

    commands.register(sub)
    distill_cli.register(sub)
    return p


#: failures caused by what the user gave (exit 2); anything else is a failure at run time (exit 1)
BAD_INPUT = (ValueError, LookupError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
             PermissionError, UnicodeError)


def describe(e: BaseException) -> str:
    """One line saying what failed, naming the file when an OS error carries one."""
    if isinstance(e, OSError) and e.filename is not None:
        what = e.strerror or type(e).__name__
        return f"{what}: {e.filename}"
    if isinstance(e, MemoryError):
        return "out of memory"
    if isinstance(e, KeyError) and e.args:
        return f"missing key {e.args[0]!r}"
    text = str(e).strip() or type(e).__name__
    first = text.splitlines()[0]
    ours = type(e).__module__.startswith("vskip")  # vskip's own errors say what failed already
    return first if ours or isinstance(e, (*BAD_INPUT, OSError)) else f"{type(e).__name__}: {first}"


def main(argv=None) -> int:
    """Every failure becomes one line on stderr: exit 2 for bad input, 1 for a failure at run
    time, 130 when interrupted. ``--debug`` (anywhere) or ``VSKIP_DEBUG=1`` shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("VSKIP_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    args = build_parser().parse_args(argv)
    args.argv = argv[1:]  # the command as given, recorded by run directories and plans
    args.command_line = shlex.join(["vskip", *argv])
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("vskip: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one error boundary of the command line
        if debug:
            raise
        print(f"vskip: error: {describe(e)}", file=sys.stderr)
        if not isinstance(e, BAD_INPUT):
            print("vskip: (run again with --debug for the traceback)", file=sys.stderr)
        return 2 if isinstance(e, BAD_INPUT) else 1


if __name__ == "__main__":
    sys.exit(main())
