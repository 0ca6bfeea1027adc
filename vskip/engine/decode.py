"""The decode loop of Figure 2: draft → score → decide → verify or skip → commit → record.

Strict SDD, lenience, top-k, the periodic baseline and the three skip signals are configurations of
this one loop (:class:`vskip.engine.policy.PolicyConfig`); ``ar`` is the verifier's own greedy decoding
through the same verifier adapter. Timing follows A.8: the decode is timed between synchronised
clock reads, and shadow verification (§3.2) is timed separately and excluded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from ..defaults import GAMMA, MAX_NEW_TOKENS
from .features import assemble_features
from .models.protocols import DraftBlock, Drafter, Predictor, Verifier
from .policy import (BlockLength, Draw, GuardContext, PolicyConfig, Sampling, accept, block_length, committed_tokens,
                     decide, prompt_key, strict_accept, verify_length)
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


class _Clocks:
    """Seconds spent per part of a round (A.8: every clock read synchronises the device)."""

    def __init__(self):
        self.seconds = {"draft": 0.0, "verify": 0.0, "predict": 0.0, "shadow": 0.0}

    def time(self, part: str, fn, *args, **kw):
        t = now()
        out = fn(*args, **kw)
        self.seconds[part] += now() - t
        return out


@dataclass
class _State:
    """What the loop carries from round to round."""

    seq: list[int]
    key: int = 0  # the prompt's key for the random numbers of a sampled decode
    D: int = 0  # unverified tokens committed since the last verifier call
    last_full: bool = False  # the previous verified block was accepted whole
    calls: int = 0
    blocks: int = 0


def decode(
    prompt: Sequence[int],
    drafter: Drafter | None,
    verifier: Verifier,
    policy: PolicyConfig,
    cfg: DecodeConfig,
    predictor: Predictor | None = None,
    task_id: str | None = None,
    sample: int = 0,
) -> DecodeResult:
    """Decode one prompt (token ids) and return the generated tokens with per-round records.
    ``task_id`` and ``sample`` (the index of a sampled completion) key its random numbers."""
    _check(prompt, drafter, verifier, policy, cfg, predictor)
    if policy.alpha is not None:  # the threshold calibrated for this prompt's fold (the prefix policy)
        policy = replace(policy, lam=predictor.threshold(task_id, policy.alpha))
    key = 0 if cfg.sampling.greedy else prompt_key(task_id, prompt, sample)  # a greedy decode draws nothing
    st, clocks = _State(list(prompt), key=key), _Clocks()
    n0, rounds, traces, stop = len(prompt), [], [], "length"
    if drafter is not None:
        drafter.reset()
    verifier.reset()
    t_start = now()
    for r in range(cfg.max_new_tokens):
        remaining = cfg.max_new_tokens - (len(st.seq) - n0)
        if remaining <= 0:
            break
        if policy.uses_drafter:
            new, rec = _sdd_round(r, st, drafter, verifier, policy, cfg, predictor, task_id, clocks, traces, n0)
        else:  # the verifier alone: one token per call (its argmax, or its draw)
            new = clocks.time("verify", verifier.score, st.seq, (), **_draw(cfg, st, len(st.seq) - n0, 1)).argmax[:1]
            st.calls += 1
            rec = RoundRecord(round=r, verified=True, K=0, K_hat=0, L=None, accepted=0, committed=1, relaxed=False,
                              reason="verify", gamma=0)
        # 5. commit: never past the budget, and nothing after an end-of-sequence token.
        new = [int(x) for x in new[:remaining]]
        cut = next((i + 1 for i, tok in enumerate(new) if tok in verifier.eos_ids), None)
        if cut is not None:
            new, stop = new[:cut], "eos"
        st.seq.extend(new)
        # 6. record
        rounds.append(_with_committed(rec, len(new)))
        if stop == "eos":
            break
    total, sec = now() - t_start, clocks.seconds
    return DecodeResult(
        tokens=st.seq[n0:], rounds=rounds, decode_seconds=total - sec["shadow"], draft_seconds=sec["draft"],
        verify_seconds=sec["verify"], predict_seconds=sec["predict"], shadow_seconds=sec["shadow"],
        verifier_calls=st.calls, draft_blocks=st.blocks, stop=stop, traces=traces,
    )


def _check(prompt, drafter, verifier, policy: PolicyConfig, cfg: DecodeConfig, predictor) -> None:
    check_prompt(prompt, verifier, cfg)
    if policy.uses_drafter and drafter is None:
        raise ValueError(f"policy {policy.name!r} needs a drafter")
    most = getattr(drafter, "max_gamma", None) if policy.uses_drafter else None
    if most is not None and cfg.blocks.longest > most:
        raise ValueError(f"this drafter drafts at most {most} tokens a block; --gamma {cfg.blocks.longest} is more")
    if cfg.trim is not None and policy.lossy_acceptance:
        raise ValueError(f"--trim would change what {policy.name} accepts; use it with strict or a skip policy")
    if policy.learned and predictor is None:
        raise ValueError(f"policy {policy.name!r} needs a trained predictor")
    check_sampling(policy, cfg, drafter)


def check_sampling(policy: PolicyConfig, cfg: DecodeConfig, drafter: Drafter | None = None) -> None:
    """Lenience and top-k acceptance are defined on the verifier's argmax: refuse them sampled.
    The speculative rule needs a drafter that drafts its block in one forward."""
    if not cfg.sampling.greedy and policy.lossy_acceptance:
        raise ValueError(f"{policy.name} acceptance is defined on the verifier's argmax; it takes no --temperature")
    check_speculative(cfg.sampling, getattr(drafter, "steps", 1))


def check_speculative(sampling: Sampling, steps: int) -> None:
    """The speculative rule is exact only for a drafter that drafts its block in one forward."""
    if sampling.speculative and steps != 1:
        raise ValueError(f"--speculative-sampling needs a drafter that drafts its block in one forward (--steps 1), "
                         f"not in {steps} reveal steps")


def _draw(cfg: DecodeConfig, st: _State, start: int, n: int, block: DraftBlock | None = None) -> dict:
    """The keyword that makes a verifier call sample: the draws of generated positions
    ``start .. start + n - 1`` (none at temperature 0). Under the speculative rule it carries the
    block's first ``n - 1`` drafted tokens, their distributions and the acceptance coins."""
    s = cfg.sampling
    if s.greedy:
        return {}
    u = s.uniforms(st.key, start, n)
    if block is None or block.q is None:
        return {"draw": Draw(s, u)}
    m = n - 1
    return {"draw": Draw(s, u, tokens=block.tokens[:m], q=block.q[:m], u_accept=s.uniforms(st.key, start, m, ACCEPT))}


def _draft_draw(cfg: DecodeConfig, st: _State, start: int, g: int) -> dict:
    """The keyword that makes the drafter sample its block (the speculative rule only)."""
    s = cfg.sampling
    return {"draw": Draw(s, s.uniforms(st.key, start, g, DRAFTER))} if s.speculative else {}


def _sdd_round(r: int, st: _State, drafter: Drafter, verifier: Verifier, policy: PolicyConfig, cfg: DecodeConfig,
               predictor, task_id, clocks: _Clocks, traces: list, n0: int):
    """One round of Figure 2 with a drafter: (tokens to commit, the round's record)."""
    generated = len(st.seq) - n0
    gamma = cfg.gamma
    if cfg.blocks.adaptive:
        gamma = block_length(cfg.blocks, drafter.match_length(st.seq), st.last_full)
    g = min(gamma, cfg.max_new_tokens - generated)
    want_features = cfg.trace or policy.learned
    # 1. draft (sampled under the speculative rule, else the drafter's own choice)
    block = clocks.time("draft", drafter.propose, st.seq, g, features=want_features, **_draft_draw(cfg, st, generated, g))
    st.blocks += 1
    # 2. score
    feats = assemble_features(block.features, generated, st.D, cfg.task) if want_features else None
    q = block.confidence
    if policy.learned:
        q = np.asarray(clocks.time("predict", predictor.scores, block, feats, task_id), dtype=np.float64)
    # 3. decide
    sec = clocks.seconds  # the costs so far (the prefix policy weighs them)
    ctx = GuardContext(np.asarray(st.seq[-_HISTORY:]), verifier.special_ids, verifier.eos_ids, shortened=g < gamma,
                       c_D=sec["draft"] / st.blocks if st.blocks else None,
                       c_V=sec["verify"] / st.calls if st.calls else None)
    d = decide(policy, st.D, r, block.tokens, q, ctx)
    if d.K > 0:
        # 4a. skip: commit the prefix unverified; the shadow verifier only audits it.
        new = block.tokens[: d.K]
        st.D += d.K
        L = None
        if cfg.shadow:
            L = strict_accept(block.tokens, clocks.time("shadow", verifier.score, st.seq, block.tokens, shadow=True,
                                                        **_draw(cfg, st, generated, g + 1, block)))
        rec = RoundRecord(round=r, verified=False, K=d.K, K_hat=d.K_hat, L=L, accepted=d.K, committed=d.K,
                          relaxed=True, reason=d.reason, gamma=g)
    else:
        # 4b. verify: the method's acceptance rule, then the correction or bonus token.
        checked = block.tokens[: verify_length(block.confidence, cfg.trim)]
        verdict = clocks.time("verify", verifier.score, st.seq, checked,
                              **_draw(cfg, st, generated, len(checked) + 1, block))
        st.calls += 1
        acc = accept(policy, checked, verdict)
        new = committed_tokens(checked, verdict, acc)
        st.D, st.last_full = 0, acc == len(checked)
        rec = RoundRecord(round=r, verified=True, K=0, K_hat=d.K_hat, L=strict_accept(checked, verdict), accepted=acc,
                          committed=0, relaxed=policy.lossy_acceptance and acc > 0, reason=d.reason, gamma=g)
    if cfg.trace:
        hidden = block.hidden
        if hidden is not None and not isinstance(hidden, np.ndarray):
            hidden = hidden.float().cpu().numpy()
        traces.append(BlockTrace(r, feats, hidden, block.confidence.copy(), rec.L, rec.K))
    return new, rec


def _with_committed(rec: RoundRecord, n: int) -> RoundRecord:
    """The record with the number of tokens actually committed (after the budget and EOS cuts);
    ``accepted`` and ``K`` shrink with it when the cut falls inside the draft prefix."""
    return replace(rec, K=min(rec.K, n), accepted=min(rec.accepted, n), committed=n)


def warmup(drafter: Drafter | None, verifier: Verifier, prompt: Sequence[int], gamma: int) -> None:
    """A.8: one draft block and one verifier forward before any timing."""
    if drafter is not None:
        drafter.warmup(list(prompt), gamma)
    verifier.warmup(list(prompt), gamma)


def agreement(rounds: Sequence[RoundRecord]) -> tuple[float, float]:
    """(StrictToken, FullPrefix) of Eqs. 1–2 over the rounds where a relaxed rule committed a
    nonempty draft prefix and L is known (:func:`vskip.engine.metrics.agreement_from_rounds`). Both are
    1 when there is no such round."""
    from .metrics import agreement_from_rounds

    st, fp, _ = agreement_from_rounds(rounds)
    return st, fp
