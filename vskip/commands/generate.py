"""``vskip generate``: one completion to stdout, its statistics to stderr."""

from __future__ import annotations

import sys

from .flags import add_policy_flags, settings


def register(subparsers) -> None:
    g = subparsers.add_parser("generate", help="one completion to stdout, statistics to stderr")
    g.add_argument("prompt", help="the user message")
    add_policy_flags(g)
    g.set_defaults(fn=cmd_generate)


def cmd_generate(a) -> int:
    from ..engine.prompting import encode_chat
    from ..engine.door import open_decoder
    from ..study.predictor import policy_predictor

    if not a.prompt.strip():
        raise ValueError("the prompt is empty")
    try:
        a.prompt.encode("utf-8")
    except UnicodeEncodeError as e:  # bytes the shell passed that are not UTF-8 (surrogate escapes)
        raise ValueError(f"the prompt is not UTF-8 text (byte {e.start} of it); pass it as UTF-8") from None
    dec = open_decoder(settings(a), a.prompt, predictors=policy_predictor)
    ids = encode_chat(dec.pair.tokenizer, a.prompt)
    dec.warmup(ids)
    res = dec.decode(ids)
    print(dec.pair.tokenizer.decode(res.tokens, skip_special_tokens=True))
    n = res.generated_tokens
    print(
        f"policy={dec.settings.policy.name} tokens={n} seconds={res.decode_seconds:.3f} "
        f"tok/s={n / max(res.decode_seconds, 1e-9):.2f} verifier_calls={res.verifier_calls} "
        f"draft_blocks={res.draft_blocks} skipped_rounds={res.skipped_rounds} stop={res.stop}",
        file=sys.stderr,
    )
    return 0
