"""Strict SDD replayed offline on stored verifier answers, without the verifier: the answers are the
verifier's own greedy tokens, so a draft's accepted length is its longest prefix equal to them, and
a whole answer decodes again through the loop itself with the answer in the verifier's place.
Training's held-out curve and the copy prior's fit both measure a drafter this way."""

from __future__ import annotations

import sys

import numpy as np
import torch
from tqdm import tqdm

from ..defaults import GAMMA, STEPS
from ..engine.decode import DecodeConfig, decode
from ..engine.models.diffusion_lm import DiffusionLM
from ..engine.models.drafter import DiffusionDrafter
from ..engine.policy import PolicyConfig, Verdict
from ..engine.policy.acceptance import leading_run
from .rows import Data


def strict_lengths(drafter: DiffusionDrafter, rows, starts, gamma: int, progress: bool = True) -> np.ndarray:
    """Offline Strict SDD accepted length of the drafter's full proposal (all reveal steps, with
    whatever copy prior it holds) at each start: the stored answers are the verifier's own greedy
    tokens, so L is the longest prefix of the draft equal to them."""
    Ls = []
    for i, b in tqdm(starts, desc="offline: strict L", unit="block", disable=not progress, file=sys.stderr):
        row = rows[i][0]
        g = min(gamma, len(row) - b)
        Ls.append(leading_run(drafter.propose(row[:b].tolist(), g).tokens == row[b : b + g]))
    return np.asarray(Ls)


class StoredAnswer:
    """A verifier whose greedy answer is a stored one (the verifier's own): its token at each
    position is the answer's, so that :func:`vskip.engine.decode.decode` replays the rounds a
    lossless decode of that answer makes. Greedy only; no end-of-sequence token stops it before
    the answer ends."""

    eos_ids = special_ids = frozenset()
    max_length = sys.maxsize
    use_cache = True

    def __init__(self, answer: np.ndarray):
        self.answer = np.asarray(answer)

    def score(self, seq, block, shadow: bool = False) -> Verdict:
        b, g = len(seq), len(block)
        tokens = np.full(g + 1, -1, np.int64)  # past the answer's end: never committed (the budget ends there)
        tail = self.answer[b : b + g + 1]
        tokens[: len(tail)] = tail
        same = np.asarray(block, np.int64) == tokens[:g]
        return Verdict(tokens, np.where(same, 0.0, -np.inf), (~same).astype(np.int64))

    def score_many(self, calls) -> list[Verdict]:
        return [self.score(c.seq, c.block, c.shadow) for c in calls]

    def distributions_many(self, calls, sampling):
        raise ValueError("a stored answer is the verifier's greedy one: it has no distributions to sample")

    def open_slots(self, n: int) -> None:
        pass

    def prefill(self, ids, slot: int = 0) -> None:
        pass

    def set_cache(self, on: bool) -> None:
        pass

    def warmup(self, seq, gamma: int) -> None:
        pass

    def reset(self, slot: int | None = None) -> None:
        pass


def simulate_strict(drafter: DiffusionDrafter, rows, gamma: int, max_new_tokens: int = 64,
                    progress: bool = True) -> dict:
    """Strict SDD decoding replayed on stored answers: the decode loop itself, each answer's first
    ``max_new_tokens`` tokens standing in for the verifier (:class:`StoredAnswer`). Exactly the
    rounds a lossless decode of these answers makes, without the verifier: tokens per verifier call
    and the accepted lengths."""
    calls = tokens = 0
    Ls = []
    for row, P in tqdm(rows, desc=f"offline: replay gamma {gamma}", unit="answer", disable=not progress,
                       file=sys.stderr):
        end = min(len(row), P + max_new_tokens)
        if end > P:
            res = decode(row[:P].tolist(), drafter, StoredAnswer(row[:end]), PolicyConfig(name="strict"),
                         DecodeConfig(gamma=gamma, max_new_tokens=end - P, shadow=False))
            Ls += [r.L for r in res.rounds]
            calls += res.verifier_calls
            tokens += res.generated_tokens
        drafter.reset()
    L = np.asarray(Ls)
    return {"answers": len(rows), "tokens": int(tokens), "calls": int(calls), "tokens_per_call": tokens / max(calls, 1),
            "mean_L": float(L.mean()) if L.size else 0.0, "p_L_ge1": float((L >= 1).mean()) if L.size else 0.0}


@torch.no_grad()
def acceptance(model: DiffusionLM, data: Data, gamma: int = GAMMA, steps: int = STEPS, n_blocks: int = 200,
               seed: int = 1) -> dict:
    """Offline Strict SDD acceptance on held-out answers: the stored answers are the verifier's own
    greedy output, so the accepted length at a block start b is the longest prefix of the draft
    that equals ``row[b:b+gamma]``. Returns mean L, P(L >= j) and tokens per verifier call."""
    rng = np.random.default_rng(seed)
    was_training = model.training
    model.eval()
    drafter = DiffusionDrafter(model, steps=steps)
    rows = list(zip(data.rows, data.prompt_lens))
    starts = []
    for _ in range(n_blocks):
        i = int(rng.integers(0, len(data)))
        row, P = rows[i]
        if len(row) - P >= 2:
            starts.append((i, int(rng.integers(P, len(row) - 1))))
    Ls = strict_lengths(drafter, rows, starts, gamma, progress=False)
    agree = first_step_agreement(drafter, rows, starts, gamma)
    model.train(was_training)
    L = np.asarray(Ls)
    return {
        "mean_L": float(L.mean()),
        "tokens_per_call": float(L.mean() + 1),
        "p_L_ge": [float((L >= j).mean()) for j in range(1, gamma + 1)],
        "first_step_top1": float(agree.mean()),
        "first_step_top1_by_position": [float(x) for x in agree.mean(0)],
        "n": int(L.size),
    }


@torch.no_grad()
def replay(model: DiffusionLM, data: Data, answers: int, tokens: int, gamma: int = GAMMA, steps: int = STEPS) -> dict:
    """Held-out acceptance on the decode path: the first ``tokens`` tokens of the first ``answers``
    held-out answers decoded again block by block as Strict SDD would (each block starts behind the
    last rejection, :func:`simulate_strict`), network alone. Unlike
    :func:`acceptance`'s random starts anywhere in an answer, this is what a run on a task sees."""
    was_training = model.training
    model.eval()
    rows = list(zip(data.rows, data.prompt_lens))[:answers]
    r = simulate_strict(DiffusionDrafter(model, steps=steps), rows, gamma, tokens, progress=False)
    model.train(was_training)
    return {"tokens_per_call": r["tokens_per_call"], "mean_L": r["mean_L"], "p_L_ge1": r["p_L_ge1"],
            "answers": r["answers"], "calls": r["calls"], "first_tokens": tokens}


def first_step_agreement(drafter: DiffusionDrafter, rows, starts, gamma: int) -> np.ndarray:
    """[blocks, gamma] bool: at the first reveal step of a fully masked block, whether the
    drafter's top token (network and hint input; no copy prior) is the verifier's token. Blocks
    that run past the answer's end are left out."""
    out = []
    for i, b in starts:
        row = rows[i][0]
        if b + gamma > len(row):
            continue
        drafter.reset()
        probs = drafter.first_step(row[:b].tolist(), gamma)
        col = drafter.head_column(torch.as_tensor(row[b : b + gamma]))
        out.append(((col >= 0) & (probs.argmax(-1) == col)).cpu().numpy())
    return np.asarray(out, dtype=bool).reshape(-1, gamma)
