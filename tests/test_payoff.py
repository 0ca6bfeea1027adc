"""Drafts that pay (vskip.engine.policy.payoff, vskip.engine.chooser): the pure choice against
brute force, the copy odds' fit and checks, the chooser's measured costs, and the loop, lossless
with every source on the fake pair."""

import numpy as np
import pytest
from fakes import FakeDrafter, FakeVerifier
from hypothesis import given, settings
from hypothesis import strategies as st

from vskip.engine.chooser import EXPLORE, REFIT_EVERY, Chooser, load_odds
from vskip.engine.decode import DecodeConfig, Job, decode, decode_many
from vskip.engine.models.copy import best_hint, fit_copy_odds
from vskip.engine.policy import PolicyConfig
from vskip.engine.policy.payoff import (ODDS_EDGES, conditional, CopyOdds, RoundCosts, choose_source, copy_length, copy_value,
                                        drafter_value, match_bucket)
from vskip.engine.settings import Settings

survivals = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12).map(lambda xs: np.sort(xs)[::-1].copy())
costs = st.builds(RoundCosts, base=st.floats(1e-4, 1e-2), per_row=st.floats(0.0, 5e-3),
                  draft=st.one_of(st.none(), st.floats(0.0, 2e-2)))


def test_match_buckets_follow_the_edges():
    assert [match_bucket(n) for n in (0, 1, 2, 3, 4, 5, 6, 7, 8, 31, 32, 100)] == [0, 1, 2, 3, 4, 4, 5, 5, 6, 9, 10, 10]
    assert match_bucket(-3) == 0


@settings(max_examples=200, deadline=None)
@given(survivals, costs, st.integers(1, 4), st.integers(0, 14))
def test_copy_length_is_the_best_k_by_brute_force(s, c, sharing, limit):
    k = copy_length(s, c, sharing, limit)
    assert 0 <= k <= min(limit, len(s))
    values = [copy_value(s, j, c, sharing) for j in range(min(limit, len(s)) + 1)]
    assert values[k] >= max(values) * (1 - 1e-12)
    if s[0] == 0.0:
        assert k == 0


@settings(max_examples=200, deadline=None)
@given(survivals, costs, st.floats(0.0, 16.0), st.integers(1, 16))
def test_the_drafter_is_chosen_exactly_when_it_pays_more(s, c, expected, gamma):
    kind, k = choose_source(s, expected, gamma, c)
    copy = copy_value(s, copy_length(s, c), c)
    if c.draft is None:
        assert kind != "drafter"
    elif drafter_value(expected, gamma, c) > copy:
        assert (kind, k) == ("drafter", gamma)
    else:
        assert kind in ("copy", "alone") and (k > 0) == (kind == "copy")


def test_measured_round_costs_replace_the_line_where_they_exist():
    c = RoundCosts(base=3.0, per_row=0.5, by_rows=(3.5, 5.0, None))
    assert [c.round(n) for n in (1, 2, 3, 4, 5)] == [3.5, 5.0, 5.0, 5.0, 5.5]  # never below a smaller round
    assert c.share(2, sharing=4) == pytest.approx(3.0 / 4 + 1.0)  # a batch's share: on the line
    # a second row that costs far more than the line says is not worth a hint right 30% of the time
    s = np.array([0.3, 0.1])
    assert copy_length(s, RoundCosts(3.0, 0.5)) == 1
    assert copy_length(s, c) == 0


@pytest.mark.parametrize("bad, why", [
    ({"survival": [[0.5, 0.6]] * len(ODDS_EDGES)}, "not grow"),
    ({"survival": [[1.5]] * len(ODDS_EDGES)}, r"\[0, 1\]"),
    ({"survival": [[0.5]] * 3}, "one non-empty row"),
    ({"survival": [[0.5], [0.4]], "length_edges": (2, 3)}, "start at 1"),
    ({"survival": [[0.5, 0.4]] * len(ODDS_EDGES), "corpus": [[0.5]] * len(ODDS_EDGES)}, "as far as"),
    ({"survival": [[0.5]] * len(ODDS_EDGES), "corpus": [[0.5, 0.7]] * len(ODDS_EDGES)}, "not grow"),
])
def test_copy_odds_refuse_what_cannot_be_odds(bad, why):
    with pytest.raises(ValueError, match=why):
        CopyOdds(**bad)


def test_the_shipped_odds_read_and_rise_with_the_match():
    odds = load_odds()
    assert odds.longest >= 16 and odds.meta["prompts"] >= 100
    first = [row[0] for row in odds.survival]
    assert first[-1] > 0.9 > first[0]  # a long match is almost always right, one token seldom
    assert np.all(odds.row(0) == 0)
    assert CopyOdds.from_json(odds.to_json()) == odds


def test_copy_odds_fit_counts_what_the_hint_got_right():
    # a period of 3 repeated: from the second token on (the first follows a 7 never seen before)
    # every hint is right to the answer's end
    prompt, answer = [5, 6, 7], [5, 6, 7] * 6
    odds = fit_copy_odds([(prompt, answer)], longest=4, prior=1e-6)
    assert odds.meta["positions"] == len(answer) - 1
    seen = np.array(odds.meta["tested"])
    rows = [b for b in range(len(ODDS_EDGES)) if seen[b, 0] > 0]
    assert rows
    for b in rows:  # 1 as far as the answers put the hint to the test
        tested = int(np.argmin(seen[b] > 0)) if (seen[b] == 0).any() else seen.shape[1]
        assert np.allclose(odds.survival[b][:tested], 1.0, atol=1e-3)
    assert all(np.allclose(odds.survival[b], 0.5 ** np.arange(1, 5)) for b in range(len(ODDS_EDGES)) if b not in rows)
    # "5 6" seen before hints 7; the answer goes on otherwise: one matched position, wrong
    odds = fit_copy_odds([([5, 6, 7, 5, 6], [9, 9])], longest=4, prior=1e-6)
    assert odds.meta["positions"] == 1 and odds.survival[match_bucket(2) - 1][0] == pytest.approx(0.0, abs=1e-3)
    with pytest.raises(ValueError, match="prior"):
        fit_copy_odds([(prompt, answer)], prior=0.0)


def test_the_chooser_measures_rounds_by_their_rows():
    ch = Chooser(decay=1.0)
    assert ch.costs() is None
    for _ in range(5):
        for rows in (1, 2, 4, 8):
            ch.observe_round(rows, 0.003 + 0.0005 * rows)
    c = ch.costs()
    assert c.base == pytest.approx(0.003, rel=0.05) and c.per_row == pytest.approx(0.0005, rel=0.1)
    assert c.by_rows[1] == pytest.approx(0.004) and c.by_rows[2] is None
    ch.observe_round(0, 1.0)  # nothing scored, or a clock read that cannot be: ignored
    ch.observe_round(3, float("nan"))
    assert ch.costs() == c


def test_the_chooser_tries_the_drafter_before_it_trusts_its_yield():
    ch = Chooser()
    seq = [1, 2, 3, 4, 1, 2, 3]  # the hint matches "1 2 3": a bucket-3 match
    assert ch.choose(seq, 8, 1, 100, drafter=True).kind in ("copy", "alone")  # nothing measured yet
    for rows in (1, 2, 3, 4, 5):
        for _ in range(4):
            ch.observe_round(rows, 0.003 + 0.0005 * rows)
    ch.observe_draft(0.002)
    tried = [ch.choose(seq, 8, 1, 100, drafter=True) for _ in range(EXPLORE)]
    assert all(s.kind == "drafter" for s in tried)
    for s in tried:
        ch.observe_yield(s.bucket, 0)  # the drafter accepted nothing here
    after = ch.choose(seq, 8, 1, 100, drafter=True)
    assert after.kind in ("copy", "alone")
    if after.kind == "copy":
        assert list(after.hint) == ([4, 1, 2, 3] * 8)[: len(after.hint)] and len(after.odds) == len(after.hint)
        assert 1 <= after.k <= len(after.hint)
    assert ch.choose(seq, 8, 1, 0, drafter=False).kind == "alone"  # no budget beyond the verifier's token


def payoff_run(error, seed, gamma, max_new, prompt=(7, 3, 9, 4), chooser=None):
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=max_new, drafts="payoff")
    return decode(list(prompt), FakeDrafter(error, seed), FakeVerifier(), PolicyConfig(name="strict"), cfg,
                  chooser=chooser)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.0, 1.0), st.integers(0, 10**6), st.integers(1, 12), st.integers(1, 80),
       st.lists(st.integers(2, 49), min_size=1, max_size=12))
def test_payoff_rounds_keep_strict_lossless(error, seed, gamma, max_new, prompt):
    ref = decode(prompt, None, FakeVerifier(), PolicyConfig(name="ar"), DecodeConfig(max_new_tokens=max_new))
    res = payoff_run(error, seed, gamma, max_new, prompt)
    assert res.tokens == ref.tokens
    for r in res.rounds:
        assert r.verified and r.K == 0  # never a skip
        if r.reason == "copy":
            assert 1 <= r.gamma and r.accepted <= r.gamma


def test_payoff_rounds_copy_where_the_text_repeats_and_the_chooser_learns():
    # the fake verifier's next token depends on the last two alone: a prompt that holds its own
    # continuation and then its start again is continued as before, which the hint copies
    start = [7, 3, 9, 4]
    prompt = start + FakeVerifier().greedy(start, 16) + start
    ch = Chooser()
    res = payoff_run(0.5, 1, 4, 200, prompt=prompt, chooser=ch)
    copied = [r for r in res.rounds if r.reason == "copy"]
    assert copied and sum(r.accepted for r in copied) >= 4
    assert ch.costs() is not None  # what this decode measured stays for the next


def test_batched_payoff_rounds_equal_their_batch_one_text():
    prompts = [[7, 3, 9, 4], [5, 5, 8], [11, 2, 11, 2, 11]]
    cfg = DecodeConfig(gamma=4, max_new_tokens=60, drafts="payoff")
    refs = [decode(p, None, FakeVerifier(), PolicyConfig(name="ar"), cfg).tokens for p in prompts]
    got = {job.task_id: r.tokens for job, r in decode_many([Job(p, str(i)) for i, p in enumerate(prompts)],
                                                            FakeDrafter(0.3, 2), FakeVerifier(),
                                                            PolicyConfig(name="strict"), cfg, batch_size=3)}
    assert [got[str(i)] for i in range(3)] == refs


def test_payoff_is_for_strict_and_raw_confidence():
    with pytest.raises(ValueError, match="drafts must be one of"):
        DecodeConfig(drafts="sometimes")
    for name in ("marginal", "lenience", "periodic", "prefix"):
        with pytest.raises(ValueError, match="--drafts payoff"):
            Settings(PolicyConfig(name=name), DecodeConfig(drafts="payoff"))
    Settings(PolicyConfig(name="ar"), DecodeConfig(drafts="payoff"))  # the preset's lossless shape: allowed
    Settings(PolicyConfig(name="raw"), DecodeConfig(drafts="payoff"))  # skips on a copied block's odds


def test_copy_odds_read_as_each_tokens_own_confidence():
    s = np.array([0.9, 0.72, 0.36, 0.0, 0.0])
    q = conditional(s)
    np.testing.assert_allclose(q, [0.9, 0.8, 0.5, 0.0, 0.0])
    np.testing.assert_allclose(np.cumprod(q), s)  # the survival again


def raw_payoff(prompt, eta, max_new=120, chooser=None):
    cfg = DecodeConfig(gamma=4, max_new_tokens=max_new, drafts="payoff")
    policy = PolicyConfig.make("raw", eta_b=eta, eta_c=eta, k_min=2)
    return decode(list(prompt), FakeDrafter(0.3, 1), FakeVerifier(), policy, cfg, chooser=chooser)


def test_raw_confidence_skips_copied_blocks_whose_odds_pass_its_gates():
    start = [7, 3, 9, 4]
    prompt = start + FakeVerifier().greedy(start, 12) + start  # the continuation is in the prompt
    ref = decode(prompt, None, FakeVerifier(), PolicyConfig(name="ar"), DecodeConfig(max_new_tokens=120))
    assert len(ref.tokens) > 12
    never = raw_payoff(prompt, 1.0)  # no copy odd reaches 1: nothing is skipped, the text is ar's
    assert never.tokens == ref.tokens and all(r.verified for r in never.rounds)
    res = raw_payoff(prompt, 0.5)
    skips = [r for r in res.rounds if not r.verified]
    assert skips and all(r.reason == "skip" and r.K >= 2 for r in skips)
    n = len(prompt)
    seq = prompt + res.tokens
    at = n
    for r in res.rounds:  # a skip commits the hint: what the sequence held earlier after the same match
        if not r.verified:
            assert seq[at: at + r.K] == best_hint(seq[:at], r.K)[0][: r.K].tolist()
        at += r.committed
    # the fake verifier continues a repeated context as before, as far as the prompt shows it;
    # past that the skip commits what the hint says, which ar does not (a skip is not lossless)
    assert res.tokens[:12] == ref.tokens[:12] and res.tokens != ref.tokens


def test_raw_confidence_on_copies_skips_no_more_than_the_staleness_allows():
    start = [7, 3, 9, 4]
    prompt = start + FakeVerifier().greedy(start, 12) + start
    cfg = DecodeConfig(gamma=4, max_new_tokens=100, drafts="payoff")
    policy = PolicyConfig.make("raw", eta_b=0.5, eta_c=0.5, k_min=1, s_max=3)
    res = decode(prompt, FakeDrafter(0.3, 1), FakeVerifier(), policy, cfg)
    unverified = 0
    for r in res.rounds:
        if r.verified:
            unverified = 0
        else:
            assert unverified < 3  # a skip starts only below s_max unverified tokens
            unverified += r.K
    assert any(not r.verified for r in res.rounds)


corpora = st.lists(st.lists(st.integers(2, 6), min_size=1, max_size=12), min_size=1, max_size=6)


def brute_match(answers, seq, skip=None):
    """The longest suffix of ``seq`` followed, in some answer other than ``skip``, by a token of
    that answer; of its occurrences (answers in order, positions in order), the last of those
    whose next two tokens (-1 past an answer's end) are the commonest among them."""
    found = []  # (length, where, next two)
    pos = 0
    for i, a in enumerate(answers):
        for j in range(len(a) - 1):
            n = 0
            while n < min(len(seq), 32) and j - n >= 0 and a[j - n] == seq[-1 - n]:
                n += 1
            if n and i != skip:
                found.append((n, pos + j + 1, (a[j + 1], a[j + 2] if j + 2 < len(a) else -1)))
        pos += len(a) + 1
    if not found:
        return 0, -1
    best = max(n for n, _, _ in found)
    at = [(w, key) for n, w, key in found if n == best]
    counts = {key: sum(k == key for _, k in at) for _, key in at}
    return best, [w for w, key in at if counts[key] == max(counts.values())][-1]


@settings(max_examples=150, deadline=None)
@given(corpora, st.lists(st.integers(2, 6), min_size=1, max_size=10), st.one_of(st.none(), st.integers(0, 5)))
def test_a_corpus_match_is_the_longest_and_commonest_by_brute_force(answers, seq, skip):
    from vskip.engine.models.copy import Corpus

    c = Corpus.of_answers(answers, "f")
    length, start = c.match(seq, skip=skip)
    assert (length, start) == brute_match(answers, seq, skip)
    for _ in range(2):  # a decode's sequences, asked again: the searches it keeps answer alike
        for n in range(1, len(seq) + 1):
            assert c.match(seq[:n], skip=skip) == brute_match(answers, seq[:n], skip), (n, seq)
    if length:
        hint = c.hint(start, 40)
        assert len(hint) >= 1 and (hint >= 0).all()  # never past its answer's end


survivals = st.lists(st.floats(0.0, 1.0), min_size=32, max_size=32).map(
    lambda v: np.minimum.accumulate(np.asarray(v)))  # odds: never growing along the row


@settings(max_examples=200, deadline=None)
@given(survivals, st.lists(st.tuples(st.integers(0, 32), st.integers(-1, 40)), min_size=1, max_size=4),
       st.floats(0.001, 0.01), st.floats(0.0, 0.002), st.one_of(st.none(), st.floats(0.0, 8.0)),
       st.integers(0, 16), st.one_of(st.none(), st.floats(0.001, 0.03)), st.integers(1, 4))
def test_a_kept_copy_length_chooses_as_the_policy_does(full, asks, base, per_row, expected, g, draft, sharing):
    """The chooser keeps each bucket's copy length while its costs and copy rounds stay: asked
    with any hint length and budget, in any order, it chooses what :func:`choose_source` does."""
    ch = Chooser()
    costs = RoundCosts(base=base, per_row=per_row, draft=draft)
    for shown, limit in asks:
        cut = full.copy()
        cut[shown:] = 0.0
        got = ch._choice(full, cut, expected, g, costs, sharing, limit, ("context", 3), shown)
        assert got == choose_source(cut, expected, g, costs, sharing, limit), (shown, limit)


def test_the_costs_are_refitted_after_each_early_round_then_every_few():
    ch = Chooser()
    fits = []
    for i in range(16 * REFIT_EVERY):
        ch.observe_round(1 + i % 4, 0.004 + 0.0005 * (1 + i % 4))
        ch.costs()
        fits.append(ch._fits)
    assert np.diff(fits[:REFIT_EVERY]).tolist()[:REFIT_EVERY - 2] == [1] * (REFIT_EVERY - 2)  # at first, each round
    late = fits[-8 * REFIT_EVERY:]
    assert late[-1] - late[0] == pytest.approx(8, abs=1)  # later, once in REFIT_EVERY rounds


def test_the_corpus_is_read_only_by_a_verifier_of_its_tokenizer():
    from vskip.engine.chooser import chooser_for, load_corpus

    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    assert chooser_for(Tok({"a": 0, "b": 1})).corpus is None
    assert chooser_for(None).corpus is None
    assert len(load_corpus().tokens) > 10_000 and load_corpus().meta["prompts"] >= 100


def test_best_hint_takes_the_corpus_only_where_it_matches_longer():
    from vskip.engine.models.copy import CORPUS_BELOW, Corpus, best_hint

    c = Corpus.of_answers([[10, 11, 12, 13, 14, 15]], "f")
    hint, length, where = best_hint([9, 11, 12, 13], 4, c)
    assert (where, length, list(hint)) == ("corpus", 3, [14, 15])  # cut at the answer's end
    seq = [11, 12, 13, 20] + [11, 12, 13]  # the sequence's own match (3) is as long: its own wins
    assert best_hint(seq, 4, c)[2] == "context"
    long_own = list(range(30, 30 + CORPUS_BELOW)) + [40] + list(range(30, 30 + CORPUS_BELOW))
    assert best_hint(long_own, 4, c)[2] == "context"


def test_copy_rounds_move_the_odds_they_were_chosen_by():
    ch = Chooser()
    seq = [1, 2, 3, 4, 1, 2, 3]
    before = ch.survival(3, "context").copy()
    src = ch._source(np.array([4, 1, 2, 3]), before, 4, match_bucket(3), "context", 4)
    for _ in range(200):
        ch.observe_copy(src, 4)  # every copied token right, again and again
    after = ch.survival(3, "context")
    assert after[3] > before[3] and after[3] > 0.8
    assert np.all(np.diff(after) <= 1e-12)  # still odds: never growing along the row
    assert np.all(ch.survival(3, "corpus") == ch.odds.row(3, "corpus"))  # another source: untouched
    assert ch.choose(seq, 8, 1, 100, drafter=False).kind == "copy"


def test_a_batch_skips_the_hint_where_no_copy_could_pay():
    ch = Chooser()
    for _ in range(10):
        for rows in (8, 12, 16):
            ch.observe_round(rows, 0.004 + 0.002 * rows)  # rows dearer than a batch's shared part
    least, corpus = ch._gate(8)
    assert least > 1 and corpus is False
    assert ch.choose([5, 6, 7, 8, 9, 6], 8, 8, 100, drafter=True).kind == "alone"  # a 1-token match, in a batch


def test_a_stalled_round_is_left_out_and_a_stale_size_goes_back_to_the_line():
    ch = Chooser()
    for _ in range(20):
        for rows in (1, 3, 5):
            ch.observe_round(rows, 0.004 + 0.0005 * rows)
    before = ch.costs()
    ch.observe_round(2, 0.5)  # the machine stalled: a hundred times the line
    assert ch.costs() == before and ch.costs().by_rows[1] is None
    for _ in range(REFIT_EVERY):  # the costs are refitted after as many
        ch.observe_round(2, 0.009)  # dear but real: believed
    assert ch.costs().by_rows[1] == pytest.approx(0.009)
    for _ in range(300):  # the chooser stops asking for 2 rows: its mean fades back to the line
        ch.observe_round(1, 0.0045)
    assert ch.costs().by_rows[1] is None and ch.costs().round(2) < 0.009


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10**6), st.floats(0.3, 1.5), st.integers(1, 60))
def test_sampled_payoff_rounds_commit_what_ar_draws_with_the_same_seed(seed, temperature, max_new):
    from vskip.engine.policy import Sampling

    start = [7, 3, 9, 4]
    prompt = start + FakeVerifier().greedy(start, 16) + start  # copied hints right often enough to be taken
    s = Sampling(temperature=temperature, seed=seed)
    ar = decode(prompt, None, FakeVerifier(), PolicyConfig(name="ar"), DecodeConfig(max_new_tokens=max_new, sampling=s),
                task_id="a")
    cfg = DecodeConfig(gamma=4, max_new_tokens=max_new, sampling=s, drafts="payoff")
    sdd = decode(prompt, FakeDrafter(0.3, seed), FakeVerifier(), PolicyConfig(name="strict"), cfg, task_id="a")
    assert sdd.tokens == ar.tokens


def _trials(modes: list, of: str) -> list[int]:
    """Where each run of ``of`` in ``modes`` begins."""
    return [i for i, m in enumerate(modes) if m == of and (i == 0 or modes[i - 1] != of)]


def test_a_batch_takes_the_mode_that_measured_more_tokens_per_second_and_retries_the_other():
    from vskip.engine.chooser import MODES, RETRY_EVERY, RETRY_MOST, TRY_ROUNDS

    ch = Chooser()
    assert ch.batch_mode(1) == "hints" and ch._modes == {}  # one sequence alone is never switched
    rate = {"hints": 100.0, "alone": 150.0}

    def run(n: int) -> list:
        out = []
        for _ in range(n):
            out.append(ch.batch_mode(4))
            ch.observe_mode(4, out[-1], 10, 10 / rate[out[-1]])
        return out

    seen = run(2 * TRY_ROUNDS + 2 * RETRY_MOST)
    assert seen[: 2 * TRY_ROUNDS] == [MODES[0]] * TRY_ROUNDS + [MODES[1]] * TRY_ROUNDS  # each tried first
    rest = seen[2 * TRY_ROUNDS:]
    assert rest.count("alone") > 0.95 * len(rest)  # then the faster one
    starts = _trials(rest, "hints")  # and the other again now and then, each trial TRY_ROUNDS long
    assert len(starts) >= 4 and rest.count("hints") == TRY_ROUNDS * len(starts)
    gaps = [b - a - TRY_ROUNDS for a, b in zip(starts, starts[1:])]
    assert starts[0] == RETRY_EVERY and gaps[:3] == [2 * RETRY_EVERY, 4 * RETRY_EVERY, 8 * RETRY_EVERY]
    assert max(gaps) == RETRY_MOST  # the trials of a mode that keeps losing grow apart, up to a limit
    # the other grows faster: after its next trial it is taken, and the first is tried again soon
    rate["hints"] = 300.0
    later = run(RETRY_MOST + 4 * RETRY_EVERY)
    switch = next(i for i in range(len(later)) if later[i: i + RETRY_EVERY] == ["hints"] * RETRY_EVERY)
    starts = _trials(later[: switch + 1], "hints")
    assert len(starts) >= 2 and all(b - a - TRY_ROUNDS == RETRY_EVERY for a, b in zip(starts, starts[1:]))
    # (each trial faster than the better mode: the next one soon, until the other is taken)
    assert later[-RETRY_EVERY:].count("hints") >= RETRY_EVERY - TRY_ROUNDS
    assert _trials(later[switch:], "alone")[0] <= RETRY_EVERY + TRY_ROUNDS  # the trials of the first start over
    assert ch._modes[4] is not ch._modes.get(8)  # each batch size measures its own


def test_a_batch_in_the_mode_without_hints_searches_none_and_stays_lossless(monkeypatch):
    import vskip.engine.chooser as chooser_module

    prompts = [[7, 3, 9, 4] + FakeVerifier().greedy([7, 3, 9, 4], 12) + [7, 3, 9, 4], [5, 5, 8], [11, 2, 11, 2, 11]]
    cfg = DecodeConfig(gamma=4, max_new_tokens=60, drafts="payoff")
    refs = [decode(p, None, FakeVerifier(), PolicyConfig(name="ar"), cfg).tokens for p in prompts]
    searched = []
    real = chooser_module.best_hint
    monkeypatch.setattr(chooser_module, "best_hint", lambda *a, **k: searched.append(1) or real(*a, **k))
    ch = Chooser()
    monkeypatch.setattr(ch, "batch_mode", lambda sharing: "alone")
    got = {job.task_id: r for job, r in decode_many([Job(p, str(i)) for i, p in enumerate(prompts)],
                                                     FakeDrafter(0.3, 2), FakeVerifier(), PolicyConfig(name="strict"),
                                                     cfg, batch_size=3, chooser=ch)}
    assert [got[str(i)].tokens for i in range(3)] == refs
    lengths = sorted(len(res.rounds) for res in got.values())
    assert len(searched) == lengths[-1] - lengths[-2]  # only the rounds a sequence had to itself searched
    # every round the three or two shared verified each one's own next token
    assert all(r.reason == "verify" and r.accepted == 0 for res in got.values() for r in res.rounds[: lengths[-2]])
    assert ch._modes[3]["seen"]["alone"][0] > 0 and ch._modes[3]["seen"]["hints"][0] == 0  # what they measured


def test_the_corpus_requests_are_mbpp_shaped_and_none_is_an_evaluation_prompt():
    import importlib.util
    from pathlib import Path

    from vskip.bench.tasks import load_task

    spec = importlib.util.spec_from_file_location("fit_copy_odds", Path(__file__).parents[1] / "scripts" / "fit_copy_odds.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    skills = script.skill_problems()
    assert len(skills) == len({p.task_id for p in skills}) > 1000
    assert all(p.prompt.startswith("Write a python function to ") and p.test.startswith(f"assert {p.entry_point}(")
               for p in skills)
    evaluated = {p.prompt.strip().lower() for task in ("mbpp", "humaneval") for p in load_task(task)}
    assert not evaluated & {p.prompt.strip().lower() for p in skills}


def test_the_budget_split_parts_a_comparison_by_where_ar_stopped(tmp_path):
    import gzip
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("budget_split", Path(__file__).parents[1] / "benchmarks" / "budget_split.py")
    split = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(split)
    run = tmp_path / "run"
    run.mkdir()
    (run / "settings.json").write_text(json.dumps({"fixed": {"max_new_tokens": 8}}))
    rows = [("a", "ar", 8, 4.0, 8), ("a", "strict", 8, 1.0, 2), ("b", "ar", 3, 3.0, 3), ("b", "strict", 3, 2.0, 2)]
    (run / "shard-1-of-1.jsonl.gz").write_bytes(gzip.compress("".join(
        json.dumps({"task_id": t, "config": c, "generated_tokens": n, "decode_seconds": s, "verifier_calls": k}) + "\n"
        for t, c, n, s, k in rows).encode()))
    groups = split.split(run)["groups"]
    assert groups["to_budget"]["prompts"] == 1 and groups["to_budget"]["configs"]["strict"]["ratio_vs_ar"] == 4.0
    assert groups["ended"]["configs"]["strict"] == {"seconds": 2.0, "tokens_per_call": 1.5, "ratio_vs_ar": 1.5}


def test_the_skills_run_resumes_past_a_torn_line_and_refuses_other_settings(tmp_path, monkeypatch):
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("fit_copy_odds", Path(__file__).parents[1] / "scripts" / "fit_copy_odds.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    probs = script.skill_problems()[:2]
    run = tmp_path / "skills"
    run.mkdir()
    (run / "samples.jsonl").write_text(json.dumps({"task_id": probs[0].task_id, "tokens": [1, 2]}) + '\n{"task_id": "sk')
    decoded = []

    class Door:  # the decoder is not loaded: each request "decodes" to its index
        @staticmethod
        def open_decoder(_):
            class Dec:
                pair = type("P", (), {"tokenizer": None})

                def decode(self, ids):
                    decoded.append(ids)
                    return type("R", (), {"tokens": [7]})

            return Dec()

    monkeypatch.setattr("vskip.engine.door.open_decoder", Door.open_decoder)
    monkeypatch.setattr(script, "encode_problem", lambda tok, p: p.task_id)
    got = script.decode_skills(run, probs, 64)
    assert got == {probs[0].task_id: [1, 2], probs[1].task_id: [7]} and decoded == [probs[1].task_id]
    assert len((run / "samples.jsonl").read_text().splitlines()) == 2  # the torn line gone, the new one whole
    with pytest.raises(SystemExit, match="holds answers decoded with"):
        script.decode_skills(run, probs, 128)
