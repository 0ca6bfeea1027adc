"""The decode loop of Figure 2: draft → score → decide → verify or skip → commit → record.

Strict SDD, lenience, top-k, the periodic baseline and the three skip signals are configurations of
this one loop (:class:`vskip.policy.PolicyConfig`); ``ar`` is the verifier's own greedy decoding
through the same verifier adapter. Timing follows A.8: the decode is timed between synchronised
clock reads, and shadow verification (§3.2) is timed separately and excluded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .defaults import GAMMA
from .features import assemble_features
from .models.protocols import Drafter, Predictor, Verifier
from .policy import (BlockLength, GuardContext, PolicyConfig, accept, block_length, committed_tokens, decide,
                     strict_accept, verify_length)
from .runtime import now

#: How many committed tokens the repetition guard looks back over.
_HISTORY = 64


@dataclass(frozen=True)
class DecodeConfig:
    """``gamma``: draft block length; ``max_new_tokens``: output budget; ``shadow``: recover L on
    skipped rounds (§3.2); ``trace``: keep the A.7 inputs of every block; ``task``: dataset name
    for the indicator features; ``gamma_max``/``min_match``: a block length per round, ``trim``:
    verify only the confident drafted prefix (:mod:`vskip.policy.blocks`; None: the paper's
    fixed blocks)."""

    gamma: int = GAMMA
    max_new_tokens: int = 512
    shadow: bool = True
    trace: bool = False
    task: str | None = None
    gamma_max: int | None = None
    min_match: int = 8
    trim: float | None = None

    def __post_init__(self):
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


def decode(
    prompt: Sequence[int],
    drafter: Drafter | None,
    verifier: Verifier,
    policy: PolicyConfig,
    cfg: DecodeConfig,
    predictor: Predictor | None = None,
    task_id: str | None = None,
) -> DecodeResult:
    """Decode one prompt (token ids) and return the generated tokens with per-round records."""
    check_prompt(prompt, verifier, cfg)
    if policy.uses_drafter and drafter is None:
        raise ValueError(f"policy {policy.name!r} needs a drafter")
    if cfg.trim is not None and policy.name in ("lenience", "topk"):
        raise ValueError(f"--trim would change what {policy.name} accepts; use it with strict or a skip policy")
    learned = policy.signal in ("marginal", "conditional")
    if learned and predictor is None:
        raise ValueError(f"policy {policy.name!r} needs a trained predictor")
    want_features = cfg.trace or learned
    eos = verifier.eos_ids
    forbidden = verifier.special_ids

    seq = list(prompt)
    n0 = len(seq)
    rounds: list[RoundRecord] = []
    traces: list[BlockTrace] = []
    t_draft = t_verify = t_predict = t_shadow = 0.0
    calls = blocks = 0
    D = 0  # unverified tokens committed since the last verifier call
    last_full = False  # the previous verified block was accepted whole
    blocks_rule = cfg.blocks
    stop = "length"

    if drafter is not None:
        drafter.reset()
    verifier.reset()
    t_start = now()
    for r in range(cfg.max_new_tokens):
        generated = len(seq) - n0
        remaining = cfg.max_new_tokens - generated
        if remaining <= 0:
            break
        if not policy.uses_drafter:
            # The verifier alone: one greedy token per call.
            t = now()
            verdict = verifier.score(seq, ())
            t_verify += now() - t
            calls += 1
            new = verdict.argmax[:1]
            rec = RoundRecord(r, True, 0, 0, None, 0, 1, False, "verify", 0)
        else:
            gamma = cfg.gamma
            if blocks_rule.adaptive:
                gamma = block_length(blocks_rule, drafter.match_length(seq), last_full)
            g = min(gamma, remaining)
            # 1. draft
            t = now()
            block = drafter.propose(seq, g, features=want_features)
            t_draft += now() - t
            blocks += 1
            # 2. score
            feats = None
            if want_features:
                feats = assemble_features(block.features, generated, D, cfg.task)
            q = block.confidence
            if learned:
                t = now()
                q = np.asarray(predictor.scores(block, feats, task_id), dtype=np.float64)
                t_predict += now() - t
            # 3. decide
            ctx = GuardContext(np.asarray(seq[-_HISTORY:]), forbidden, eos, shortened=g < gamma)
            d = decide(policy, D, r, block.tokens, q, ctx)
            if d.K > 0:
                # 4a. skip: commit the prefix unverified; the shadow verifier only audits it.
                new = block.tokens[: d.K]
                D += d.K
                L = None
                if cfg.shadow:
                    t = now()
                    L = strict_accept(block.tokens, verifier.score(seq, block.tokens, shadow=True))
                    t_shadow += now() - t
                rec = RoundRecord(r, False, d.K, d.K_hat, L, d.K, d.K, True, d.reason, g)
            else:
                # 4b. verify: the method's acceptance rule, then the correction or bonus token.
                checked = block.tokens[: verify_length(block.confidence, cfg.trim)]
                t = now()
                verdict = verifier.score(seq, checked)
                t_verify += now() - t
                calls += 1
                L = strict_accept(checked, verdict)
                acc = accept(policy, checked, verdict)
                new = committed_tokens(checked, verdict, acc)
                D = 0
                last_full = acc == len(checked)
                relaxed = policy.name in ("lenience", "topk") and acc > 0
                rec = RoundRecord(r, True, 0, d.K_hat, L, acc, 0, relaxed, d.reason, g)
            if cfg.trace:
                hidden = block.hidden
                if hidden is not None and not isinstance(hidden, np.ndarray):
                    hidden = hidden.float().cpu().numpy()
                traces.append(BlockTrace(r, feats, hidden, block.confidence.copy(), rec.L, rec.K))
        # 5. commit: never past the budget, and nothing after an end-of-sequence token.
        new = [int(x) for x in new[:remaining]]
        for i, tok in enumerate(new):
            if tok in eos:
                new = new[: i + 1]
                stop = "eos"
                break
        seq.extend(new)
        # 6. record
        rounds.append(_with_committed(rec, len(new)))
        if stop == "eos":
            break
    t_total = now() - t_start
    return DecodeResult(
        tokens=seq[n0:],
        rounds=rounds,
        decode_seconds=t_total - t_shadow,
        draft_seconds=t_draft,
        verify_seconds=t_verify,
        predict_seconds=t_predict,
        shadow_seconds=t_shadow,
        verifier_calls=calls,
        draft_blocks=blocks,
        stop=stop,
        traces=traces,
    )


def _with_committed(rec: RoundRecord, n: int) -> RoundRecord:
    """The record with the number of tokens actually committed (after the budget and EOS cuts);
    ``accepted`` and ``K`` shrink with it when the cut falls inside the draft prefix."""
    acc = min(rec.accepted, n)
    return RoundRecord(
        rec.round, rec.verified, min(rec.K, n), rec.K_hat, rec.L, acc, n, rec.relaxed, rec.reason, rec.gamma
    )


def warmup(drafter: Drafter | None, verifier: Verifier, prompt: Sequence[int], gamma: int) -> None:
    """A.8: one draft block and one verifier forward before any timing."""
    if drafter is not None:
        drafter.warmup(list(prompt), gamma)
    verifier.warmup(list(prompt), gamma)


def agreement(rounds: Sequence[RoundRecord]) -> tuple[float, float]:
    """(StrictToken, FullPrefix) of Eqs. 1–2 over the rounds where a relaxed rule committed a
    nonempty draft prefix and L is known. Both are 1 when there is no such round."""
    pairs = [(r.accepted, r.L) for r in rounds if r.relaxed and r.accepted > 0 and r.L is not None]
    if not pairs:
        return 1.0, 1.0
    K = np.array([p[0] for p in pairs], dtype=np.float64)
    L = np.array([p[1] for p in pairs], dtype=np.float64)
    return float(np.minimum(K, L).sum() / K.sum()), float(np.mean(K <= L))
