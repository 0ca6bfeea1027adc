"""The run aggregates of vskip.engine.metrics.summarize, the one place they are computed."""

import pytest

from vskip.engine.metrics import PromptResult, summarize
from vskip.study.rundir import RoundRow


def _sample(tid, **kw):
    s = {"task_id": tid, "generated_tokens": 10, "decode_seconds": 2.0, "verifier_calls": 4, "draft_blocks": 5,
         "skipped_rounds": 1, "draft_seconds": 0.5, "verify_seconds": 1.0, "passed": True}
    return s | kw


def _round(tid, verified, K, L, accepted, relaxed, committed, gamma=8):
    return RoundRow(task_id=tid, verified=verified, K=K, L=L, accepted=accepted, relaxed=relaxed,
                    committed=committed, gamma=gamma)


def test_totals_ratios_and_agreement():
    samples = [_sample("a"), _sample("b", passed=False)]
    rounds = [_round("a", True, 0, 3, 3, False, 4), _round("a", False, 6, 4, 6, True, 6),
              _round("b", True, 0, 7, 7, False, 8), _round("b", False, 4, 4, 4, True, 4)]
    s = summarize(samples, rounds)
    assert s["tokens_per_s"] == pytest.approx(20 / 4.0) and s["calls_per_token"] == pytest.approx(8 / 20)
    assert s["c_D"] == pytest.approx(1.0 / 10) and s["c_V"] == pytest.approx(2.0 / 8)
    assert s["pass_at_1"] == 0.5 and s["A"] == pytest.approx(6.0)
    # Eq. 1: (min(6, 4) + min(4, 4)) / (6 + 4); Eq. 2: one of two skips is whole
    assert s["strict_token"] == pytest.approx(0.8) and s["full_prefix"] == pytest.approx(0.5)
    assert "missing" not in s


def test_unknowns_are_none_and_named():
    s = summarize([_sample("a", draft_seconds=None)], [_round("a", False, 6, None, 6, True, 6)])
    assert s["c_D"] is None and s["policy_seconds"] is None and s["tokens_per_s"] == pytest.approx(5.0)
    # skips nobody verified (no shadow verifier): agreement is unknown, not perfect
    assert s["strict_token"] is None and s["full_prefix"] is None
    assert "draft_seconds" in s["missing"] and any("no shadow verifier" in m for m in s["missing"])
    old = RoundRow.from_json({"task_id": "a", "verified": False, "K": 6, "L": 3, "committed": 6})  # an older file's row
    s = summarize([_sample("a")], [old])
    assert s["strict_token"] is None and "relaxed/accepted round fields" in s["missing"]


def test_a_prompts_record_round_trips_and_is_what_summarize_totals():
    """PromptResult: the measures of one decode as samples.jsonl and compare's rows hold them; a
    decoder outside the loop has N and T alone, and summarize names what it lacks."""
    from fakes import FakeDrafter, FakeVerifier

    from vskip.engine.decode import DecodeConfig, decode
    from vskip.engine.policy import PolicyConfig

    res = decode([7, 3, 9, 2], FakeDrafter(0.3, 2), FakeVerifier(), PolicyConfig(name="strict"),
                 DecodeConfig(gamma=8, max_new_tokens=30))
    rec = PromptResult.of(res)
    assert PromptResult.from_json(rec.to_json()) == rec
    assert (rec.generated_tokens, rec.verifier_calls, rec.draft_blocks) == (len(res.tokens), res.verifier_calls,
                                                                             res.draft_blocks)
    s = summarize([{"task_id": "a", **rec.to_json()}], [])
    assert (s["generated_tokens"], s["verifier_calls"], s["draft_blocks"]) == (len(res.tokens), res.verifier_calls,
                                                                                res.draft_blocks)
    assert "missing" not in s
    hf = PromptResult(generated_tokens=5, decode_seconds=1.0)
    assert hf.to_json() == {"generated_tokens": 5, "decode_seconds": 1.0}
    s = summarize([{"task_id": "a", **hf.to_json()}], [])
    assert s["tokens_per_s"] == 5.0 and s["verifier_calls"] is None and "verifier_calls" in s["missing"]


def test_resamples_keep_each_callers_random_stream_and_allow_no_prompts():
    """stats.resample_indices draws what the callers drew before it existed: one block, or the
    same chunks in turn; no prompts give empty resamples, not an error."""
    import numpy as np

    from vskip.stats import resample_indices

    one = next(resample_indices(7, 50, 3))
    assert np.array_equal(one, np.random.default_rng(3).integers(0, 7, size=(50, 7)))
    rng, old = np.random.default_rng(3), []
    for start in range(0, 50, 20):  # the chunked loop of the report's intervals, 140 elements a chunk
        old.append(rng.integers(0, 7, size=(min(50, start + 20) - start, 7)))
    new = list(resample_indices(7, 50, 3, max_elements=140))
    assert [b.shape for b in new] == [(20, 7), (20, 7), (10, 7)]
    assert all(np.array_equal(a, b) for a, b in zip(old, new))
    assert [b.shape for b in resample_indices(0, 5, 0, max_elements=140)] == [(5, 0)]
