"""The models' side of a round of the decode loop (:mod:`vskip.engine.decode`): the drafter's and
the verifier's calls for every sequence of a round, grouped so that a batch of the same settings
is one call, and the clocks each sequence's time goes to (A.8)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .models.protocols import Call, Drafter, Predictor, Verifier
from .policy import Rule, Sampling, draw_rows
from .policy.sampling import DRAFTER
from .runtime import now


class Clocks:
    """Seconds spent per part of a round (A.8: every clock read synchronises the device)."""

    def __init__(self):
        self.seconds = {"draft": 0.0, "verify": 0.0, "predict": 0.0, "shadow": 0.0}

    def time(self, part: str, fn, *args, **kw):
        t = now()
        out = fn(*args, **kw)
        self.seconds[part] += now() - t
        return out


@dataclass
class Models:
    """What every sequence of the loop shares: the models, the rule, the shadow and drafter clocks,
    and the chooser of the rounds whose drafts pay (:class:`vskip.engine.chooser.Chooser`; made
    when a sequence first asks for one)."""

    drafter: Drafter | None
    verifier: Verifier
    predictor: Predictor | None
    rule: Rule
    shadow_seconds: float = 0.0
    draft_seconds: float = 0.0
    chooser: object = None

    def draft(self, drafting: dict) -> dict:
        """The drafter's calls for the sequences ``drafting`` {slot: decode}, one per kind of
        request (one for a batch of the same settings): each one's block (under the speculative
        rule, with the tokens the loop draws from its distributions), the block length its policy
        asked for and the one drafted, by slot. A call's time goes to each participant's draft clock."""
        out = {}
        for group in _groups(drafting, lambda d: (d.cfg.trace or d.policy.learned,
                                                  d.cfg.sampling if d.cfg.sampling.speculative else None)):
            lengths = {slot: d.block_length() for slot, d in group.items()}
            d0 = next(iter(group.values()))
            s, features = d0.cfg.sampling, d0.cfg.trace or d0.policy.learned
            t = now()
            blocks = self.drafter.propose_many([(slot, d.seq, lengths[slot][1]) for slot, d in group.items()],
                                               features=features, sampling=s if s.speculative else None)
            for (slot, d), block in zip(group.items(), blocks):
                d.blocks += 1
                if s.speculative:
                    g = lengths[slot][1]
                    block = replace(block, tokens=draw_rows(block.q, s.uniforms(d.key, d.generated, g, DRAFTER)))
                out[slot] = (block, *lengths[slot])
            spent = now() - t
            self.draft_seconds += spent
            for d in group.values():
                d.clocks.seconds["draft"] += spent
        return out

    def judge(self, asks: dict, clock: str) -> dict:
        """The verifier's forwards over the sequences' calls ``asks`` {slot: (decode, ask)}, one per
        way of scoring (one for a batch of the same sampling settings): each one's verdict (its
        scores judged by the rule with its own numbers), by slot. A forward's time goes to each
        participant's ``clock`` (and the shadow clock all sequences subtract)."""
        out = {}
        shadow = clock == "shadow"
        for group in _groups(asks, lambda da: _scoring(da[0].cfg.sampling)):
            calls = [Call(d.seq, a.shadow if shadow else a.verify, shadow, slot) for slot, (d, a) in group.items()]
            sampling = next(iter(group.values()))[0].cfg.sampling
            t = now()
            if sampling.greedy:
                scores = self.verifier.score_many(calls)
            else:
                scores = self.verifier.distributions_many(calls, sampling)
            spent = now() - t
            if shadow:
                self.shadow_seconds += spent
            for (slot, (d, a)), call, sc in zip(group.items(), calls, scores):
                d.clocks.seconds[clock] += spent
                out[slot] = self.rule.verdict(sc, None if sampling.greedy else d.draw(len(call.block) + 1, a.block))
        return out


def _scoring(s: Sampling):
    """What a verifier forward's scores depend on: the greedy argmax, or the warped distribution."""
    return None if s.greedy else (s.temperature, s.top_p, s.top_k)


def _groups(items: dict, key) -> list[dict]:
    """``items`` split by ``key`` of their values, each group in the items' order."""
    groups: dict = {}
    for k, v in items.items():
        groups.setdefault(key(v), {})[k] = v
    return list(groups.values())
