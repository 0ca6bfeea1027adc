"""The decode loop of Figure 2: draft → score → decide → verify or skip → commit → record.

Strict SDD, lenience, top-k, the periodic baseline and the three skip signals are configurations of
this one loop (:class:`vskip.engine.policy.PolicyConfig`); ``ar`` is the verifier's own greedy decoding
through the same verifier adapter. The models only draft and score; the acceptance rule and every
random draw are the policy's (:class:`vskip.engine.policy.Rule`). Timing follows A.8: the decode is
timed between synchronised clock reads, and shadow verification (§3.2) is timed separately and
excluded.

A round reads as its steps (:class:`_Decode`): choose the block length, draft, score, decide,
then skip or verify, then commit, which builds the round's record once, complete.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from ..defaults import GAMMA, MAX_NEW_TOKENS
from .features import assemble_features
from .models.protocols import DraftBlock, Drafter, Predictor, Verifier
from .policy import (RULE, BlockLength, Decision, Draw, GuardContext, PolicyConfig, Rule, Sampling, block_length,
                     committed_tokens, decide, draw_rows, prompt_key, strict_accept, verify_length)
from .policy.sampling import ACCEPT, DRAFTER
from .runtime import now

#: How many committed tokens the repetition guard looks back over.
_HISTORY = 64


@dataclass(frozen=True)
class DecodeConfig:
    """``gamma``: draft block length; ``max_new_tokens``: output budget; ``shadow``: recover L on
    skipped rounds (§3.2); ``trace``: keep the A.7 inputs of every block; ``task``: dataset name
    for the indicator features; ``gamma_max``/``min_match``: a block length per round, ``trim``:
    verify only the confident drafted prefix (:mod:`vskip.engine.policy.blocks`; None: the paper's
    fixed blocks); ``sampling``: temperature 0 (greedy, the paper) or the verifier's sampling
    settings and seed (:mod:`vskip.engine.policy.sampling`)."""

    gamma: int = GAMMA
    max_new_tokens: int = MAX_NEW_TOKENS
    shadow: bool = True
    trace: bool = False
    task: str | None = None
    gamma_max: int | None = None
    min_match: int = 8
    trim: float | None = None
    sampling: Sampling = Sampling()

    def __post_init__(self):
        if isinstance(self.sampling, dict):  # read back from a run directory's config.json
            object.__setattr__(self, "sampling", Sampling(**self.sampling))
        self.blocks  # validates gamma, gamma_max, min_match and trim
        if self.trace and self.trim is not None:
            raise ValueError("traces need the strict length L of whole blocks: collect them without --trim")
        if self.max_new_tokens < 1:
            raise ValueError(f"max-new-tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def blocks(self) -> BlockLength:
        return BlockLength(self.gamma, self.gamma_max, self.min_match, self.trim)


@dataclass(frozen=True)
class RoundRecord:
    """One round. ``K``: committed skip length (0 on a verified round); ``L``: strict accepted
    length (from the shadow verifier on skipped rounds, None without it); ``accepted``: draft tokens
    committed; ``committed``: all tokens committed (with the correction or bonus token);
    ``relaxed``: committed by a lossy rule (a skip, lenience or top-k), the set A of §3.2."""

    round: int
    verified: bool
    K: int
    K_hat: int
    L: int | None
    accepted: int
    committed: int
    relaxed: bool
    reason: str
    gamma: int


@dataclass
class BlockTrace:
    """The A.7 inputs of one block: features [gamma, 19], hidden [gamma, d], raw confidence
    [gamma], and the strict accepted length L (None on an unshadowed skip)."""

    round: int
    features: np.ndarray
    hidden: np.ndarray | None
    confidence: np.ndarray
    L: int | None
    K: int


@dataclass
class DecodeResult:
    tokens: list[int]
    rounds: list[RoundRecord]
    decode_seconds: float
    draft_seconds: float
    verify_seconds: float
    predict_seconds: float
    shadow_seconds: float
    verifier_calls: int
    draft_blocks: int
    stop: str
    traces: list[BlockTrace] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return len(self.tokens)

    @property
    def skipped_rounds(self) -> int:
        return sum(1 for r in self.rounds if not r.verified)

    @property
    def policy_seconds(self) -> float:
        """T_policy of Eq. 7: decode time outside drafting and verification forwards."""
        return max(0.0, self.decode_seconds - self.draft_seconds - self.verify_seconds)


def check_prompt(prompt: Sequence[int], verifier: Verifier, cfg: DecodeConfig) -> None:
    if len(prompt) == 0:
        raise ValueError("the prompt is empty")
    need = len(prompt) + cfg.max_new_tokens + cfg.blocks.longest + 1
    if need > verifier.max_length:
        raise ValueError(
            f"prompt of {len(prompt)} tokens + {cfg.max_new_tokens} new tokens + a block of "
            f"{cfg.blocks.longest} exceeds the verifier's context of {verifier.max_length} tokens"
        )


def check_settings(policy: PolicyConfig, cfg: DecodeConfig, steps: int | None = None) -> None:
    """The rules that tie a policy to decode settings, checked once where settings are made
    (:class:`vskip.engine.settings.Settings`): trimming only where it cannot change what is accepted,
    lenience and top-k greedy only, and the speculative rule only for a drafter that drafts in one
    forward (``steps``; None: checked against the drafter by :func:`check_models`)."""
    if cfg.trim is not None and policy.lossy_acceptance:
        raise ValueError(f"--trim would change what {policy.name} accepts; use it with strict or a skip policy")
    if not cfg.sampling.greedy and policy.lossy_acceptance:
        raise ValueError(f"{policy.name} acceptance is defined on the verifier's argmax; it takes no --temperature")
    if steps is not None and policy.uses_drafter:
        check_speculative(cfg.sampling, steps)


def check_speculative(sampling: Sampling, steps: int) -> None:
    """The speculative rule is exact only for a drafter that drafts its block in one forward."""
    if sampling.speculative and steps != 1:
        raise ValueError(f"--speculative-sampling needs a drafter that drafts its block in one forward (--steps 1), "
                         f"not in {steps} reveal steps")


def check_models(drafter: Drafter | None, policy: PolicyConfig, cfg: DecodeConfig, predictor) -> None:
    """What the settings ask of the models they meet: a drafter (drafting blocks this long, in one
    forward for the speculative rule) and a predictor where the policy needs them."""
    if not policy.uses_drafter:
        return
    if drafter is None:
        raise ValueError(f"policy {policy.name!r} needs a drafter")
    if drafter.max_gamma is not None and cfg.blocks.longest > drafter.max_gamma:
        raise ValueError(f"this drafter drafts at most {drafter.max_gamma} tokens a block; "
                         f"--gamma {cfg.blocks.longest} is more")
    check_speculative(cfg.sampling, drafter.steps)
    if policy.learned and predictor is None:
        raise ValueError(f"policy {policy.name!r} needs a trained predictor")


class _Clocks:
    """Seconds spent per part of a round (A.8: every clock read synchronises the device)."""

    def __init__(self):
        self.seconds = {"draft": 0.0, "verify": 0.0, "predict": 0.0, "shadow": 0.0}

    def time(self, part: str, fn, *args, **kw):
        t = now()
        out = fn(*args, **kw)
        self.seconds[part] += now() - t
        return out


@dataclass(frozen=True)
class _Outcome:
    """What a skip or a verification proposes to commit, before the budget and EOS cuts."""

    new: np.ndarray
    verified: bool
    K: int
    K_hat: int
    L: int | None
    accepted: int
    relaxed: bool
    reason: str
    gamma: int


def decode(
    prompt: Sequence[int],
    drafter: Drafter | None,
    verifier: Verifier,
    policy: PolicyConfig,
    cfg: DecodeConfig,
    predictor: Predictor | None = None,
    task_id: str | None = None,
    sample: int = 0,
    rule: Rule = RULE,
) -> DecodeResult:
    """Decode one prompt (token ids) and return the generated tokens with per-round records.
    ``task_id`` and ``sample`` (the index of a sampled completion) key its random numbers;
    ``rule``: the acceptance rule (the paper's unless another is given). The settings themselves
    are checked where they are made (:func:`check_settings`); here, what they ask of the models."""
    check_prompt(prompt, verifier, cfg)
    check_models(drafter, policy, cfg, predictor)
    if policy.alpha is not None:  # the threshold calibrated for this prompt's fold (the prefix policy)
        policy = replace(policy, lam=predictor.threshold(task_id, policy.alpha))
    return _Decode(prompt, drafter, verifier, policy, cfg, predictor, task_id, sample, rule).run()


class _Decode:
    """One prompt's decode: the models, the settings and what the loop carries from round to round."""

    def __init__(self, prompt, drafter, verifier, policy: PolicyConfig, cfg: DecodeConfig, predictor, task_id,
                 sample: int, rule: Rule):
        self.drafter = drafter if policy.uses_drafter else None
        self.verifier, self.policy, self.cfg, self.predictor, self.rule = verifier, policy, cfg, predictor, rule
        self.task_id = task_id
        self.key = 0 if cfg.sampling.greedy else prompt_key(task_id, prompt, sample)  # a greedy decode draws nothing
        self.seq, self.n0 = list(prompt), len(prompt)
        self.D = 0  # unverified tokens committed since the last verifier call
        self.last_full = False  # the previous verified block was accepted whole
        self.calls = self.blocks = 0
        self.clocks, self.traces = _Clocks(), []

    @property
    def generated(self) -> int:
        return len(self.seq) - self.n0

    def run(self) -> DecodeResult:
        if self.drafter is not None:
            self.drafter.reset()
        self.verifier.reset()
        rounds, stop = [], "length"
        t_start = now()
        if self.drafter is not None and self.drafter.reads_verifier:  # the drafter's context: the prompt's features
            self.clocks.time("draft", self.verifier.prefill, self.seq[:-1])
        for r in range(self.cfg.max_new_tokens):
            if self.generated >= self.cfg.max_new_tokens:
                break
            out = self.sdd_round(r) if self.drafter is not None else self.ar_round()
            rec, stop = self.commit(r, out)
            rounds.append(rec)
            if stop == "eos":
                break
        total, sec = now() - t_start, self.clocks.seconds
        return DecodeResult(
            tokens=self.seq[self.n0:], rounds=rounds, decode_seconds=total - sec["shadow"],
            draft_seconds=sec["draft"], verify_seconds=sec["verify"], predict_seconds=sec["predict"],
            shadow_seconds=sec["shadow"], verifier_calls=self.calls, draft_blocks=self.blocks, stop=stop,
            traces=self.traces,
        )

    # -- the verifier alone ------------------------------------------------------------------
    def ar_round(self) -> _Outcome:
        """One token per call: the verifier's argmax, or its draw."""
        v = self.judge(())
        self.calls += 1
        return _Outcome(v.tokens[:1], verified=True, K=0, K_hat=0, L=None, accepted=0, relaxed=False,
                        reason="verify", gamma=0)

    # -- a round of Figure 2 -----------------------------------------------------------------
    def sdd_round(self, r: int) -> _Outcome:
        gamma, g = self.block_length()
        block = self.draft(g)
        q, feats = self.score(block)
        d = self.decide(r, block, q, shortened=g < gamma)
        out = self.skip(block, d, g) if d.K > 0 else self.verify(block, d, g)
        if self.cfg.trace:
            self.traces.append(BlockTrace(r, feats, block.hidden_array(), block.confidence.copy(), out.L, out.K))
        return out

    def block_length(self) -> tuple[int, int]:
        """(the block length the policy asks for, that length within the remaining budget)."""
        gamma = self.cfg.gamma
        if self.cfg.blocks.adaptive:
            gamma = block_length(self.cfg.blocks, self.drafter.match_length(self.seq), self.last_full)
        return gamma, min(gamma, self.cfg.max_new_tokens - self.generated)

    def draft(self, g: int) -> DraftBlock:
        """1. Draft: the drafter's choice at each position, or under the speculative rule tokens the
        loop draws from the drafter's distributions with the positions' own numbers."""
        return self.clocks.time("draft", self._draft, g)

    def _draft(self, g: int) -> DraftBlock:
        s = self.cfg.sampling
        features = self.cfg.trace or self.policy.learned
        block = self.drafter.propose(self.seq, g, features=features, sampling=s if s.speculative else None)
        self.blocks += 1
        if s.speculative:
            block = replace(block, tokens=draw_rows(block.q, s.uniforms(self.key, self.generated, g, DRAFTER)))
        return block

    def score(self, block: DraftBlock) -> tuple[np.ndarray, np.ndarray | None]:
        """2. Score: the raw confidences, or the trained predictor's scores of the block's features."""
        want = self.cfg.trace or self.policy.learned
        feats = assemble_features(block.features, self.generated, self.D, self.cfg.task) if want else None
        if not self.policy.learned:
            return block.confidence, feats
        q = self.clocks.time("predict", self.predictor.scores, block, feats, self.task_id)
        return np.asarray(q, dtype=np.float64), feats

    def decide(self, r: int, block: DraftBlock, q: np.ndarray, shortened: bool) -> Decision:
        """3. Decide: the skip length K (0: verify), with the costs so far for the prefix policy."""
        sec = self.clocks.seconds
        ctx = GuardContext(np.asarray(self.seq[-_HISTORY:]), self.verifier.special_ids, self.verifier.eos_ids,
                           shortened=shortened, c_D=sec["draft"] / self.blocks if self.blocks else None,
                           c_V=sec["verify"] / self.calls if self.calls else None)
        return decide(self.policy, self.D, r, block.tokens, q, ctx)

    def skip(self, block: DraftBlock, d: Decision, g: int) -> _Outcome:
        """4a. Skip: commit the prefix unverified; the shadow verifier only audits it (L)."""
        self.D += d.K
        L = None
        if self.cfg.shadow:
            L = strict_accept(block.tokens, self.judge(block.tokens, block, shadow=True))
        return _Outcome(block.tokens[: d.K], verified=False, K=d.K, K_hat=d.K_hat, L=L, accepted=d.K, relaxed=True,
                        reason=d.reason, gamma=g)

    def verify(self, block: DraftBlock, d: Decision, g: int) -> _Outcome:
        """4b. Verify: the method's acceptance rule, then the correction or bonus token."""
        checked = block.tokens[: verify_length(block.confidence, self.cfg.trim)]
        v = self.judge(checked, block)
        self.calls += 1
        acc = self.rule.accept(self.policy, checked, v)
        self.D, self.last_full = 0, acc == len(checked)
        return _Outcome(committed_tokens(checked, v, acc), verified=True, K=0, K_hat=d.K_hat,
                        L=strict_accept(checked, v), accepted=acc, relaxed=self.policy.lossy_acceptance and acc > 0,
                        reason=d.reason, gamma=g)

    def judge(self, tokens: Sequence[int], block: DraftBlock | None = None, shadow: bool = False):
        """The verifier's verdict on ``tokens`` after the committed sequence: it scores them (its
        argmax, or its warped distributions when sampling) and the rule draws with the numbers of
        the generated positions they occupy (under the speculative rule, with the block's q)."""
        s, clock = self.cfg.sampling, "shadow" if shadow else "verify"
        if s.greedy:
            return self.rule.verdict(self.clocks.time(clock, self.verifier.score, self.seq, tokens, shadow=shadow), None)
        p = self.clocks.time(clock, self.verifier.distributions, self.seq, tokens, s, shadow=shadow)
        return self.rule.verdict(p, self._draw(len(tokens) + 1, block))

    def _draw(self, n: int, block: DraftBlock | None) -> Draw:
        """The numbers of generated positions ``generated .. generated + n - 1``; under the
        speculative rule also the block's first ``n - 1`` drafted tokens, their q and the coins."""
        s, start = self.cfg.sampling, self.generated
        u = s.uniforms(self.key, start, n)
        if block is None or block.q is None:
            return Draw(s, u)
        m = n - 1
        return Draw(s, u, tokens=block.tokens[:m], q=block.q[:m], u_accept=s.uniforms(self.key, start, m, ACCEPT))

    # -- 5. commit and 6. record ---------------------------------------------------------------
    def commit(self, r: int, out: _Outcome) -> tuple[RoundRecord, str]:
        """Commit never past the budget and nothing after an end-of-sequence token; the record of
        the round, built once with what was committed (``accepted`` and ``K`` shrink with a cut that
        falls inside the draft prefix)."""
        new = [int(x) for x in out.new[: self.cfg.max_new_tokens - self.generated]]
        cut = next((i + 1 for i, tok in enumerate(new) if tok in self.verifier.eos_ids), None)
        stop = "length"
        if cut is not None:
            new, stop = new[:cut], "eos"
        self.seq.extend(new)
        n = len(new)
        rec = RoundRecord(round=r, verified=out.verified, K=min(out.K, n), K_hat=out.K_hat, L=out.L,
                          accepted=min(out.accepted, n), committed=n, relaxed=out.relaxed, reason=out.reason,
                          gamma=out.gamma)
        return rec, stop


def warmup(drafter: Drafter | None, verifier: Verifier, prompt: Sequence[int], gamma: int) -> None:
    """A.8: one draft block and one verifier forward before any timing."""
    if drafter is not None:
        if drafter.reads_verifier:
            verifier.prefill(list(prompt)[:-1])
        drafter.warmup(list(prompt), gamma)
    verifier.warmup(list(prompt), gamma)


def agreement(rounds: Sequence[RoundRecord]) -> tuple[float, float]:
    """(StrictToken, FullPrefix) of Eqs. 1–2 over the rounds where a relaxed rule committed a
    nonempty draft prefix and L is known (:func:`vskip.engine.metrics.agreement_from_rounds`). Both are
    1 when there is no such round."""
    from .metrics import agreement_from_rounds

    st, fp, _ = agreement_from_rounds(rounds)
    return st, fp
