"""What to expect on this machine before a long run (``vskip expect``).

A minute's measurement of what decides Strict SDD's speed-up here: the verifier's cost for one
position (an ``ar`` step) and for a block of gamma + 1 (a verification), and the drafter's cost for
a block, on real text (a HumanEval prompt and the verifier's own continuation; random token ids
would make the exact head rescore many near-tied tokens). With the tokens per verifier call A that
a committed study measured, Eq. 7 without T_policy expects Strict SDD at
``A c_V(1) / (c_D + c_V(gamma + 1))`` times ``ar``: a CPU whose verification costs more steps gains
less from the same A.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

#: Strict SDD's tokens per verifier call at the default settings (gamma 8, one reveal step, the
#: embedded pair) on HumanEval's 164 prompts at 512 new tokens: docs/results/speed/he164/summary.json
TOKENS_PER_CALL = 3.2168
#: where :data:`TOKENS_PER_CALL` comes from, as the command prints it
SOURCE = "Strict SDD at the defaults on HumanEval's 164 prompts at 512 new tokens (docs/results/speed.md)"


def _median_seconds(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def measure(drafter, verifier, text: Sequence[int], gamma: int, reps: int = 7) -> dict:
    """Median seconds of c_V(1), c_V(gamma + 1) and c_D on ``text`` (real token ids, longer than
    gamma + 1): its last gamma + 1 tokens are the new positions, its own next tokens the block."""
    from ..engine.models.protocols import Call

    text = [int(t) for t in text]
    if len(text) < gamma + 2:
        raise ValueError(f"the text to measure on has {len(text)} tokens; a block of {gamma} needs {gamma + 2}")
    ctx, nxt = text[: len(text) - gamma - 1], text[len(text) - gamma - 1:]
    verifier.open_slots(1)
    verifier.reset()
    verifier.score_many([Call(ctx, [])])  # the context cached, as in a decode
    c_v1 = _median_seconds(lambda: verifier.score_many([Call(ctx + nxt[:1], [], shadow=True)]), reps)
    c_vg = _median_seconds(lambda: verifier.score_many([Call(ctx, nxt[:gamma], shadow=True)]), reps)
    out = {"gamma": gamma, "c_V1": c_v1, "c_Vg": c_vg, "c_D": None}
    if drafter is not None:
        drafter.reset()
        drafter.propose_many([(0, ctx, gamma)])  # its context cached
        out["c_D"] = _median_seconds(lambda: drafter.propose_many([(0, ctx, gamma)]), reps)
        drafter.reset()
    verifier.reset()
    return out


def expected_vs_ar(costs: dict, tokens_per_call: float = TOKENS_PER_CALL) -> float:
    """Eq. 7 without T_policy: ``ar`` pays c_V(1) a token, Strict SDD (c_D + c_V(gamma + 1)) / A."""
    return tokens_per_call * costs["c_V1"] / (costs["c_D"] + costs["c_Vg"])
