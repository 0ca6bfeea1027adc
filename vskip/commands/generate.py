"""``vskip generate``: one completion to stdout, its statistics to stderr."""

from __future__ import annotations

import sys

from .flags import add_policy_flags, configs


def register(subparsers) -> None:
    g = subparsers.add_parser("generate", help="one completion to stdout, statistics to stderr")
    g.add_argument("prompt", help="the user message")
    add_policy_flags(g)
    g.set_defaults(fn=cmd_generate)


def cmd_generate(a) -> int:
    from ..engine.decode import decode, warmup
    from ..engine.models.load import open_pair
    from ..engine.prompting import encode_chat
    from ..engine.runtime import resolve_runtime

    if not a.prompt.strip():
        raise ValueError("the prompt is empty")
    try:
        a.prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # bytes the shell passed that are not UTF-8 (surrogate escapes)
        raise ValueError(f"the prompt is not UTF-8 text (byte {e.start} of it); pass it as UTF-8") from None
    policy, dec, models = configs(a)
    runtime = resolve_runtime(models.device, models.dtype, models.threads, models.drafter_dtype,
                              models.drafter_device, models.verifier_device, models.max_memory)
    from ..engine.models.load import check_prompt_fits

    n = check_prompt_fits(models.verifier, a.prompt, dec.max_new_tokens)  # tokenizer only: before any model loads
    pair = open_pair(models, need_drafter=policy.uses_drafter, budget=(n, dec.max_new_tokens, dec.gamma))
    predictor = None
    if policy.learned:
        from ..study.predictor import load_predictor, note_thresholds

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
