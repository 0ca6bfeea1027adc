"""The decode loop of Figure 2: draft → score → decide → verify or skip → commit → record.

Strict SDD, lenience, top-k, the periodic baseline and the three skip signals are configurations of
this one loop (:class:`vskip.engine.policy.PolicyConfig`); ``ar`` is the verifier's own greedy decoding
through the same verifier adapter. The models only draft and score; the acceptance rule and every
random draw are the policy's (:class:`vskip.engine.policy.Rule`). Timing follows A.8: the decode is
timed between synchronised clock reads, and shadow verification (§3.2) is timed separately and
excluded.

A round reads as its steps (:class:`_Decode`): choose the block length, draft, score, decide,
then skip or verify, then commit, which builds the round's record once, complete. Under
``--drafts payoff`` a Strict SDD round first chooses its draft's source (:meth:`_Decode.source`):
a copied block is verified like a drafted one, so the text stays the verifier's own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Iterable, Iterator, Sequence

import numpy as np

from .calls import Clocks, Models
from .chooser import ALONE, Chooser, Source
from .features import assemble_features
from .models.protocols import DraftBlock, Drafter, Predictor, Verifier
from .policy import (RULE, Decision, Draw, GuardContext, PolicyConfig, Rule, block_length, committed_tokens, decide,
                     prompt_key, strict_accept, verify_length)
from .policy.payoff import conditional
from .policy.sampling import ACCEPT
from .records import BlockTrace, DecodeResult, Job, RoundRecord, Step  # noqa: F401 - the loop's records, read from here too
from .runtime import now
from .settings import DecodeConfig, check_models, check_prompt

#: How many committed tokens the repetition guard looks back over.
_HISTORY = 64


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


def decode(prompt: Sequence[int], drafter: Drafter | None, verifier: Verifier, policy: PolicyConfig,
           cfg: DecodeConfig, predictor: Predictor | None = None, task_id: str | None = None, sample: int = 0,
           rule: Rule = RULE, chooser: Chooser | None = None) -> DecodeResult:
    """Decode one prompt (token ids) and return the generated tokens with per-round records: the
    loop of :func:`decode_many` with one prompt."""
    [(_, result)] = decode_many([Job(prompt, task_id, sample)], drafter, verifier, policy, cfg, predictor, rule=rule,
                                chooser=chooser)
    return result


def decode_many(jobs: Iterable[Job], drafter: Drafter | None, verifier: Verifier, policy: PolicyConfig,
                cfg: DecodeConfig, predictor: Predictor | None = None, batch_size: int = 1,
                rule: Rule = RULE, prefill_chunk: int | None = None,
                draft_max_batch: int | None = None, chooser: Chooser | None = None) -> Iterator[tuple[Job, DecodeResult]]:
    """Decode ``jobs`` through one :class:`Loop` of ``batch_size`` slots: a finished sequence's
    slot takes the next job at once (continuous batching). Yields each job with its result as it
    finishes; a sequence's failure is raised. ``chooser``: the one whose measured costs payoff
    rounds start from (a decoder keeps one across its calls; None: a new one)."""
    loop = Loop(drafter if policy.uses_drafter else None, verifier, policy, cfg, predictor, batch_size, rule,
                prefill_chunk, draft_max_batch, chooser=chooser)
    queue = deque(jobs)
    while queue or loop.active:
        while queue and loop.free:
            loop.admit(queue.popleft())
        for step in loop.round():
            if step.error is not None:
                raise step.error
            if step.result is not None:
                yield step.job, step.result


class Loop:
    """The decode loop. It holds up to ``batch_size`` sequences; each :meth:`round`, every sequence
    runs its own steps up to the verifier (block length, draft, score, decide), then the sequences
    that verify share one verifier forward, the shadow verifications of those that skipped share
    another (off the clock), and each commits on its own. Jobs join between rounds (:meth:`admit`)
    and may leave between rounds (:meth:`cancel`).

    ``policy``, ``cfg``: the settings of jobs that bring none of their own. ``rule``: the
    acceptance rule (the paper's unless another is given). The settings themselves are checked
    where they are made (:func:`check_settings`); here, what they ask of the models.

    ``prefill_chunk``: None reads a joining prompt whole in its first round. A number makes the
    prefill chunked: each round first reads at most that many prompt tokens, of the sequences
    still reading theirs in the order they joined, into the verifier's and the drafter's caches,
    and a sequence takes part in rounds once its prompt is read. A long prompt then delays the
    running sequences' rounds by one chunk's forward at a time, not by its whole prefill (the
    server's scheduling, docs/serve.md). With ``prefill_depth`` D, each token of a chunk that starts
    at depth d counts 1 + d/D against the budget (it attends to d keys or more: D is the depth at
    which that costs what the rest of its forward costs), so a chunk deep in a long prompt holds
    fewer tokens. A drafter
    that reads the verifier's states gets its prompt read whole when it joins, as before.

    ``draft_max_batch``: None drafts for every sequence whose method drafts. A number lets a round
    in which more than that many sequences decode verify the Strict SDD sequences without a draft
    (the verifier's own next token, as ``ar``): on a CPU a batch's verifier forward grows with its
    rows, and past a few sequences the drafted rows cost more than they save. Only sequences whose
    text cannot change go draftless (Strict SDD, greedy or sampled by the verifier's own draws, no
    block traces); every other method drafts as asked.

    ``chooser``: where Strict SDD's rounds draft by payoff (``--drafts payoff``), the
    :class:`~vskip.engine.chooser.Chooser` that picks each round's source, the copy hint alone,
    the drafter or none, from the costs it has measured (one is made when a sequence first needs
    it; a decoder hands the same one to every loop it opens). Every round teaches it what that
    round cost (:class:`_RoundClock`).

    A failure in one sequence's own steps ends that sequence alone (its :class:`Step` carries the
    error); a failure of a forward the sequences share is raised."""

    def __init__(self, drafter: Drafter | None, verifier: Verifier, policy: PolicyConfig, cfg: DecodeConfig,
                 predictor: Predictor | None = None, batch_size: int = 1, rule: Rule = RULE,
                 prefill_chunk: int | None = None, draft_max_batch: int | None = None,
                 prefill_depth: int | None = None, chooser: Chooser | None = None):
        if batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {batch_size}")
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ValueError(f"a prefill chunk holds at least one token, not {prefill_chunk}")
        if draft_max_batch is not None and draft_max_batch < 0:
            raise ValueError(f"draft_max_batch must be >= 0, got {draft_max_batch}")
        self.prefill_chunk, self.draft_max_batch, self.prefill_depth = prefill_chunk, draft_max_batch, prefill_depth
        check_models(drafter, policy, cfg, predictor)
        self.policy, self.cfg, self.batch_size = policy, cfg, batch_size
        self.models = Models(drafter, verifier, predictor, rule, chooser=chooser)
        self.active: dict[int, _Decode] = {}
        verifier.open_slots(batch_size)
        if drafter is not None:
            drafter.reset()

    @property
    def free(self) -> int:
        """How many slots are free."""
        return self.batch_size - len(self.active)

    def admit(self, job: Job) -> int:
        """Give ``job`` the lowest free slot; returns the slot. Refuses a prompt that does not fit
        and settings the models cannot run."""
        if not self.free:
            raise RuntimeError("every slot of the loop is taken")
        policy, cfg = job.policy or self.policy, job.cfg or self.cfg
        if job.policy is not None or job.cfg is not None:
            check_models(self.models.drafter, policy, cfg, self.models.predictor)
        check_prompt(job.prompt, self.models.verifier, cfg)
        if policy.alpha is not None:  # the threshold calibrated for this prompt's fold (the prefix policy)
            policy = replace(policy, lam=self.models.predictor.threshold(job.task_id, policy.alpha))
        slot = next(s for s in range(self.batch_size) if s not in self.active)
        self.active[slot] = _Decode(job, slot, self.models, policy, cfg, chunked=self.prefill_chunk is not None)
        return slot

    @property
    def reading(self) -> int:
        """How many sequences are still reading their prompts (chunked prefill)."""
        return sum(1 for d in self.active.values() if d.unread)

    def cancel(self, slot: int) -> DecodeResult:
        """End the sequence in ``slot`` now (its result so far, stop ``cancelled``); the slot is free."""
        d = self.active.pop(slot)
        d.stop = "cancelled"
        return d.result()

    def round(self) -> list[Step]:
        """One round of every active sequence (with a chunked prefill, first a chunk of the prompts
        still being read); a :class:`Step` per sequence that decoded in it (or failed), in the order
        they joined the loop."""
        steps = {}
        if self.prefill_chunk is not None:
            self._prefill(steps)
        ready = {slot: d for slot, d in self.active.items() if not d.unread}  # their prompts read
        crowded = self.draft_max_batch is not None and len(ready) > self.draft_max_batch
        chooser = self.models.chooser
        mode = chooser.batch_mode(len(ready)) if len(ready) > 1 and any(d.payoff for d in ready.values()) else None
        clock = _RoundClock(self.models, ready, mode)
        sources = {slot: self._own(slot, steps, d.source, len(ready), not crowded) if mode != "alone" else ALONE
                   for slot, d in ready.items() if d.payoff}
        ready = {slot: d for slot, d in ready.items() if slot in self.active}  # a failed choice ends its sequence
        sources = {slot: src for slot, src in sources.items() if src is not None}
        drafting = {slot: d for slot, d in ready.items() if d.drafter is not None and not (crowded and d.exact)
                    and (slot not in sources or sources[slot].kind == "drafter")}
        blocks = self.models.draft(drafting)
        for slot, src in sources.items():
            if src.kind == "copy":  # the hint alone, its odds as its confidence
                blocks[slot] = ready[slot].copied(src)
        asks = {}
        for slot, d in ready.items():
            asks[slot] = self._own(slot, steps, d.plan, *blocks.get(slot, (None, 0, 0)))
        active = self.active
        asks = {s: a for s, a in asks.items() if s in active}
        verdicts = self.models.judge({s: (active[s], a) for s, a in asks.items() if a.verify is not None}, "verify")
        shadows = self.models.judge({s: (active[s], a) for s, a in asks.items() if a.shadow is not None}, "shadow")
        for slot in list(asks):
            d, before = active[slot], active[slot].generated
            done = self._own(slot, steps, d.finish, asks[slot], verdicts.get(slot), shadows.get(slot))
            if slot not in active:
                continue
            new = d.seq[d.n0 + before:]
            if done:
                del active[slot]
            steps[slot] = Step(d.job, slot, new, d.rounds[-1], d.result() if done else None)
        clock.observe(asks, sources, len(drafting), sum(len(st.committed) for st in steps.values()))
        return list(steps.values())

    def _prefill(self, steps: dict) -> None:
        """Read up to ``prefill_chunk`` prompt tokens of the sequences still reading, first come first."""
        budget = self.prefill_chunk
        for slot, d in list(self.active.items()):
            if budget <= 0:
                break
            if d.unread:
                budget -= self._own(slot, steps, d.read, budget, self.prefill_depth) or budget

    def _own(self, slot: int, steps: dict, fn, *args):
        """Run one sequence's own step; a failure there ends that sequence alone."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - reported on the sequence's Step
            d = self.active.pop(slot)
            d.stop = "error"
            steps[slot] = Step(d.job, slot, [], None, d.result(), e)
            return None


class _RoundClock:
    """What a round teaches the chooser of drafts (:class:`vskip.engine.chooser.Chooser`): the
    round's time outside the drafter and the shadow forwards by the rows its verifier scored,
    the drafter's time per sequence, and what each drafter round its chooser asked for accepted.
    In a round of several sequences, also the whole round's tokens and seconds in its ``mode``
    (:meth:`~vskip.engine.chooser.Chooser.batch_mode`). A round in which a sequence reads its
    prompt teaches nothing of the costs."""

    def __init__(self, models: Models, ready: dict, mode: str | None = None):
        self.models, self.ready, self.mode = models, ready, mode
        self.t, self.draft, self.shadow = now(), models.draft_seconds, models.shadow_seconds
        self.fresh = any(not d.rounds for d in ready.values())
        self.before = {slot: len(d.rounds) for slot, d in ready.items()}
        self.pending = {slot: d.D for slot, d in ready.items()}  # skipped tokens a verification reads too

    def observe(self, asks: dict, sources: dict, drafting: int, tokens: int = 0) -> None:
        """The round ended: ``asks``, what its sequences asked of the verifier; ``sources``, the
        chooser's choices; ``drafting``, how many sequences the drafter drafted for; ``tokens``,
        what the round committed."""
        chooser = self.models.chooser
        if chooser is None or not self.ready:
            return
        drafted = self.models.draft_seconds - self.draft
        seconds = now() - self.t - drafted - (self.models.shadow_seconds - self.shadow)
        if not self.fresh:
            chooser.observe_round(sum(len(a.verify) + 1 + self.pending.get(slot, 0) for slot, a in asks.items()
                                      if a.verify is not None), seconds)
            if self.mode is not None:
                chooser.observe_mode(len(self.ready), self.mode, tokens, seconds + drafted)
        if drafting:
            chooser.observe_draft(drafted / drafting)
        for slot, src in sources.items():
            d = self.ready[slot]
            if len(d.rounds) == self.before[slot] or d.rounds[-1].L is None:
                continue
            if src.kind == "drafter":
                chooser.observe_yield(src.bucket, d.rounds[-1].L)
            elif src.kind == "copy":
                chooser.observe_copy(src, d.rounds[-1].L)


@dataclass
class _Ask:
    """What a sequence asks of the verifier this round: the tokens to verify, or to shadow-verify
    after a skip (None: nothing), with its block and decision."""

    verify: np.ndarray | tuple | None
    shadow: np.ndarray | None = None
    block: DraftBlock | None = None
    decision: Decision | None = None
    gamma: int = 0
    feats: np.ndarray | None = None


class _Decode:
    """One prompt's decode in the loop: its slot, settings, and what it carries from round to round."""

    def __init__(self, job: Job, slot: int, models: Models, policy: PolicyConfig, cfg: DecodeConfig,
                 chunked: bool = False):
        self.job, self.slot, self.models, self.policy, self.cfg = job, slot, models, policy, cfg
        self.drafter = models.drafter if policy.uses_drafter else None
        self.verifier = models.verifier
        # a round may verify it without a draft: its text is the verifier's own either way
        self.exact = policy.name == "strict" and not cfg.sampling.speculative and not cfg.trace
        # and its draft may come from wherever pays most (the copy hint, the drafter or none); so
        # may raw confidence's, which skips on the copy odds of a copied block
        own = not cfg.sampling.speculative and not cfg.trace
        self.payoff = (self.exact or (policy.name == "raw" and own)) and cfg.drafts == "payoff" and self.drafter is not None
        if self.payoff and models.chooser is None:
            models.chooser = Chooser()
        self.key = 0 if cfg.sampling.greedy else prompt_key(job.task_id, job.prompt, job.sample)  # greedy draws nothing
        self.seq, self.n0 = list(job.prompt), len(job.prompt)
        self.D = 0  # unverified tokens committed since the last verifier call
        self.last_full = False  # the previous verified block was accepted whole
        self.calls = self.blocks = 0
        self.clocks, self.traces, self.rounds, self.stop = Clocks(), [], [], "length"
        if self.drafter is not None:
            self.drafter.reset(slot)
        self.verifier.reset(slot)
        self.t_start, self.shadow_start = now(), models.shadow_seconds
        reads = self.drafter is not None and self.drafter.reads_verifier
        if reads:  # the drafter's context: the prompt's features
            self.clocks.time("draft", self.verifier.prefill, self.seq[:-1], slot)
        # prompt tokens (all but the last, which the first round reads) its caches still lack
        self.read_to = self.n0 - 1 if reads or not chunked else 0

    @property
    def unread(self) -> int:
        """Prompt tokens the chunked prefill has still to read (0: the sequence decodes)."""
        return max(0, self.n0 - 1 - self.read_to)

    def read(self, budget: float, depth: int | None = None) -> float:
        """Read more prompt tokens into the verifier's and the drafter's caches, up to ``budget``
        (each counting 1 + d/``depth`` for a chunk that starts at depth d; one token at least);
        what they counted."""
        weight = 1.0 + self.read_to / depth if depth else 1.0
        end = min(self.n0 - 1, self.read_to + max(1, int(budget / weight)))
        ids = self.seq[:end]
        self.clocks.time("verify", self.verifier.prefill, ids, self.slot)
        if self.drafter is not None:
            self.clocks.time("draft", self.drafter.prefill, ids, self.slot)
        n, self.read_to = end - self.read_to, end
        return n * weight

    @property
    def generated(self) -> int:
        return len(self.seq) - self.n0

    def result(self) -> DecodeResult:
        total = now() - self.t_start - (self.models.shadow_seconds - self.shadow_start)
        sec = self.clocks.seconds
        return DecodeResult(
            tokens=self.seq[self.n0:], rounds=self.rounds, decode_seconds=total, draft_seconds=sec["draft"],
            verify_seconds=sec["verify"], predict_seconds=sec["predict"], shadow_seconds=sec["shadow"],
            verifier_calls=self.calls, draft_blocks=self.blocks, stop=self.stop, traces=self.traces,
        )

    # -- a round of Figure 2, up to the verifier -----------------------------------------------
    def source(self, sharing: int, drafter: bool) -> Source:
        """Step 1 of a payoff round: where its draft comes from (``sharing``: sequences in the
        round; ``drafter``: the drafter may draft for it this round)."""
        limit = self.cfg.max_new_tokens - self.generated - 1  # the verifier's own token comes on top
        return self.models.chooser.choose(self.seq, lambda: self.block_length()[1], sharing, limit, drafter)

    def copied(self, src: Source) -> tuple[DraftBlock, int, int]:
        """A copy source's block, with the block length it asks to verify and the one drafted:
        the ``k`` copied tokens that pay to verify, or, for a method that may skip, the whole hint
        the budget allows (its skip rule reads each token's copy odds; a verification still
        checks only the first ``k``)."""
        n = len(src.hint) if self.policy.may_skip else src.k
        return DraftBlock(src.hint[:n], conditional(src.odds[:n]).astype(np.float32), copied=True), src.k, n

    def plan(self, block: DraftBlock | None, gamma: int, g: int) -> _Ask:
        """Steps 2-3 (score, decide) on the round's drafted ``block`` (block length ``g`` of the
        ``gamma`` asked for; steps 1, the block length and the draft, ran for the whole batch in
        :meth:`Models.draft`): what this round asks of the verifier. The verifier alone (``ar``,
        or a Strict SDD round of a crowded batch) asks for one token per call: its argmax, or its draw."""
        if block is None:
            return _Ask(verify=())
        q, feats = self.score(block)
        d = self.decide(block, q, shortened=g < gamma and not block.copied)
        if d.K > 0:  # 4a. skip: the shadow verifier only audits the committed prefix (L)
            return _Ask(None, block.tokens if self.cfg.shadow else None, block, d, g, feats)
        # a copied block is verified as far as its chooser found it worth
        checked = block.tokens[:gamma] if block.copied else block.tokens[: verify_length(block.confidence, self.cfg.trim)]
        return _Ask(checked, None, block, d, g, feats)

    def block_length(self) -> tuple[int, int]:
        """(the block length the policy asks for, that length within the remaining budget)."""
        gamma = self.cfg.gamma
        if self.cfg.blocks.adaptive:
            gamma = block_length(self.cfg.blocks, self.drafter.match_length(self.seq), self.last_full)
        return gamma, min(gamma, self.cfg.max_new_tokens - self.generated)

    def score(self, block: DraftBlock) -> tuple[np.ndarray, np.ndarray | None]:
        """2. Score: the raw confidences, or the trained predictor's scores of the block's features."""
        want = self.cfg.trace or self.policy.learned
        feats = assemble_features(block.features, self.generated, self.D, self.cfg.task) if want else None
        if not self.policy.learned:
            return block.confidence, feats
        q = self.clocks.time("predict", self.models.predictor.scores, block, feats, self.job.task_id)
        return np.asarray(q, dtype=np.float64), feats

    def decide(self, block: DraftBlock, q: np.ndarray, shortened: bool) -> Decision:
        """3. Decide: the skip length K (0: verify), with the costs so far for the prefix policy."""
        sec = self.clocks.seconds
        ctx = GuardContext(np.asarray(self.seq[-_HISTORY:]), self.verifier.special_ids, self.verifier.eos_ids,
                           shortened=shortened, c_D=sec["draft"] / self.blocks if self.blocks else None,
                           c_V=sec["verify"] / self.calls if self.calls else None)
        return decide(self.policy, self.D, len(self.rounds), block.tokens, q, ctx)

    def draw(self, n: int, block: DraftBlock | None) -> Draw:
        """The numbers of generated positions ``generated .. generated + n - 1``; under the
        speculative rule also the block's first ``n - 1`` drafted tokens, their q and the coins."""
        s, start = self.cfg.sampling, self.generated
        u = s.uniforms(self.key, start, n)
        if block is None or block.q is None:
            return Draw(s, u)
        m = n - 1
        return Draw(s, u, tokens=block.tokens[:m], q=block.q[:m], u_accept=s.uniforms(self.key, start, m, ACCEPT))

    # -- 4. the verdicts, 5. commit and 6. record ----------------------------------------------------
    def finish(self, ask: _Ask, verdict, shadow) -> bool:
        """Complete the round with the verifier's verdicts; returns whether the decode is done."""
        if ask.block is None:  # the verifier alone
            self.calls += 1
            out = _Outcome(verdict.tokens[:1], verified=True, K=0, K_hat=0, L=None, accepted=0, relaxed=False,
                           reason="verify", gamma=0)
        elif ask.verify is None:
            out = self.skip(ask, shadow)
        else:
            out = self.verify(ask, verdict)
        if self.cfg.trace:
            self.traces.append(BlockTrace(len(self.rounds), ask.feats, ask.block.hidden_array(),
                                          ask.block.confidence.copy(), out.L, out.K))
        self.commit(out)
        return self.stop == "eos" or self.generated >= self.cfg.max_new_tokens

    def skip(self, ask: _Ask, shadow) -> _Outcome:
        """4a. Skip: commit the prefix unverified."""
        d = ask.decision
        self.D += d.K
        L = strict_accept(ask.block.tokens, shadow) if shadow is not None else None
        return _Outcome(ask.block.tokens[: d.K], verified=False, K=d.K, K_hat=d.K_hat, L=L, accepted=d.K,
                        relaxed=True, reason=d.reason, gamma=ask.gamma)

    def verify(self, ask: _Ask, v) -> _Outcome:
        """4b. Verify: the method's acceptance rule, then the correction or bonus token."""
        checked = ask.verify
        self.calls += 1
        acc = self.models.rule.accept(self.policy, checked, v)
        self.D, self.last_full = 0, acc == len(checked)
        return _Outcome(committed_tokens(checked, v, acc), verified=True, K=0, K_hat=ask.decision.K_hat,
                        L=strict_accept(checked, v), accepted=acc, relaxed=self.policy.lossy_acceptance and acc > 0,
                        reason="copy" if ask.block.copied else ask.decision.reason, gamma=ask.gamma)

    def commit(self, out: _Outcome) -> None:
        """Commit never past the budget and nothing after an end-of-sequence token; the record of
        the round, built once with what was committed (``accepted`` and ``K`` shrink with a cut that
        falls inside the draft prefix)."""
        new = [int(x) for x in out.new[: self.cfg.max_new_tokens - self.generated]]
        cut = next((i + 1 for i, tok in enumerate(new) if tok in self.verifier.eos_ids), None)
        if cut is not None:
            new, self.stop = new[:cut], "eos"
        self.seq.extend(new)
        n = len(new)
        self.rounds.append(RoundRecord(round=len(self.rounds), verified=out.verified, K=min(out.K, n), K_hat=out.K_hat,
                                       L=out.L, accepted=min(out.accepted, n), committed=n, relaxed=out.relaxed,
                                       reason=out.reason, gamma=out.gamma))


def warmup(drafter: Drafter | None, verifier: Verifier, prompt: Sequence[int], gamma: int) -> None:
    """A.8: one draft block and one verifier forward before any timing."""
    if drafter is not None:
        if drafter.reads_verifier:
            verifier.prefill(list(prompt)[:-1])
        drafter.warmup(list(prompt), gamma)
    verifier.warmup(list(prompt), gamma)
