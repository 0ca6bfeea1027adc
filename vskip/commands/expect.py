"""``vskip expect``: what Strict SDD's speed-up will be on this machine, from a minute's measurement."""

from __future__ import annotations

from ..defaults import GAMMA, STANDALONE_DRAFTER, STEPS
from .flags import add_model_flags, bounded


def register(subparsers) -> None:
    e = subparsers.add_parser("expect", help="what Strict SDD's speed-up will be on this machine, measured in a minute",
                              description="Measure the verifier's cost for one position and for a block of gamma + 1, "
                                          "and the drafter's for a block, on real text; then Eq. 7 with the tokens per "
                                          "call a committed study measured gives the speed-up to expect here. Eq. 7 "
                                          "takes one block length: this is Strict SDD in the study shape (fixed blocks "
                                          "of gamma 8, --preset study), whose A is committed; the default decode's "
                                          "blocks vary in length, and vskip compare measures it.")
    e.add_argument("--gamma", type=bounded(int, 1, 4096), default=GAMMA,
                   help=f"block length (default: {GAMMA}, the study shape's)")
    e.add_argument("--steps", type=bounded(int, 1, 64), default=STEPS, help=f"reveal steps (default: {STEPS})")
    e.add_argument("--tokens-per-call", type=bounded(float, 1.0, 1e6),
                   help="A, tokens per verifier call, from your own run (default: the committed study's, which "
                        "holds for the study shape on the embedded pair only)")
    add_model_flags(e)
    e.set_defaults(fn=cmd_expect)


def cmd_expect(a) -> int:
    from ..bench import tasks
    from ..engine.decode import DecodeConfig, decode
    from ..engine.policy import PolicyConfig
    from ..engine.runtime import machine, machine_id
    from ..engine.door import open_models
    from ..study.expect import SOURCE, TOKENS_PER_CALL, expected_vs_ar, measure
    from .flags import model_config

    pair = open_models(model_config(a), True)
    ids = tasks.encode_problem(pair.tokenizer, tasks.load_task("humaneval", limit=1)[0])
    cont = decode(ids, None, pair.verifier, PolicyConfig(name="ar"), DecodeConfig(max_new_tokens=a.gamma + 9)).tokens
    c = measure(pair.drafter, pair.verifier, list(ids) + cont, a.gamma)
    steps = c["c_Vg"] / c["c_V1"]
    for name, sec, what in (("c_V(1)", c["c_V1"], "a verifier step: what ar pays a token"),
                            (f"c_V({a.gamma + 1})", c["c_Vg"], f"a verification of {a.gamma + 1} positions: {steps:.2f} steps"),
                            ("c_D", c["c_D"], f"the drafter's block of {a.gamma}")):
        print(f"{name:<10}{1000 * sec:8.1f} ms  {what}")
    defaults = a.gamma == GAMMA and a.steps == STEPS and a.drafter in (None, STANDALONE_DRAFTER) and not a.verifier
    if a.tokens_per_call is None and not defaults:
        print("The committed A holds for the study shape and the embedded pair only: give --tokens-per-call from a "
              "run of yours (its tokens per verifier call) for the speed-up to expect.")
    else:
        A, where = (a.tokens_per_call, "given") if a.tokens_per_call is not None else (TOKENS_PER_CALL, SOURCE)
        print(f"Eq. 7 with A = {A:.3f} tokens per call ({where}): Strict SDD at A c_V(1) / (c_D + c_V({a.gamma + 1})) "
              f"= {expected_vs_ar(c, A):.2f}x ar on this machine.")
    print(f"Machine: {machine_id(machine(pair.runtime))}")
    return 0
