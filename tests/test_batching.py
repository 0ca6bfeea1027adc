"""The batched loop: B sequences per round, ragged acceptance, skips decided per sequence, slots
refilled from the queue. With the fake pair (float64 numpy, stateless) a batch decodes every
prompt exactly as batch 1 does, for every policy; the verifier's ragged cache gives each row what
a verifier of its own gives."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeDrafter, FakeVerifier, StubPredictor
from hypothesis import given, settings
from hypothesis import strategies as st

from vskip.engine.decode import DecodeConfig, Job, decode, decode_many
from vskip.engine.models.protocols import Call
from vskip.engine.policy import PolicyConfig, Sampling

POLICIES = [
    PolicyConfig(name="ar"),
    PolicyConfig(name="strict"),
    PolicyConfig.make("lenience", lenience=0.3),
    PolicyConfig.make("topk", top_k=3),
    PolicyConfig.make("periodic", period=3, period_k=4),
    PolicyConfig.make("raw", eta_b=0.6, eta_c=0.6, k_min=1, s_max=12),
    PolicyConfig.make("prefix", lam=0.5, cost_ratio=0.05),
    PolicyConfig.make("marginal", eta_m=0.5, k_min=1),
]


def _jobs(n: int, seed: int) -> list[Job]:
    rng = np.random.default_rng(seed)
    return [Job([int(x) for x in rng.integers(2, 50, int(rng.integers(2, 9)))], task_id=f"t{i}") for i in range(n)]


def _rows(res):
    return (res.tokens, [tuple(vars(r).values()) for r in res.rounds], res.verifier_calls, res.draft_blocks, res.stop)


def _one_by_one(jobs, policy, cfg, error):
    pred = StubPredictor(2.0) if policy.learned else None
    return {j.task_id: _rows(decode(j.prompt, FakeDrafter(error), FakeVerifier(), policy, cfg, pred, task_id=j.task_id,
                                    sample=j.sample)) for j in jobs}


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
@pytest.mark.parametrize("batch", [2, 3, 7])
def test_a_batch_decodes_each_prompt_as_batch_one_does(policy, batch):
    """Seven prompts of different lengths, in a shuffled order, through 2, 3 or 7 slots: every
    prompt's tokens, rounds, calls and blocks equal its batch-1 decode (ragged acceptance, skips
    with their shadow L, refills after each finish)."""
    cfg = DecodeConfig(gamma=6, max_new_tokens=50, task="humaneval", trace=policy.learned)
    jobs = _jobs(7, 3)
    want = _one_by_one(jobs, policy, cfg, 0.3)
    order = [jobs[i] for i in np.random.default_rng(batch).permutation(len(jobs))]
    pred = StubPredictor(2.0) if policy.learned else None
    got = {j.task_id: _rows(r) for j, r in decode_many(order, FakeDrafter(0.3), FakeVerifier(), policy, cfg, pred,
                                                        batch_size=batch)}
    assert got == want
    if policy.name in ("periodic", "raw", "prefix", "marginal"):  # the batch held skipped rounds too
        assert any(not rec[1] for r in got.values() for rec in r[1])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), batch=st.integers(1, 6), n=st.integers(1, 9), gamma=st.integers(1, 10),
       error=st.floats(0.0, 1.0), temperature=st.sampled_from([0.0, 0.7]), gamma_max=st.sampled_from([None, 12]))
def test_any_batch_equals_batch_one(seed, batch, n, gamma, error, temperature, gamma_max):
    """Random prompts, batch sizes, block shapes and (coupled) sampling: the same output per prompt."""
    s = Sampling(temperature=temperature, seed=seed % 1000)
    cfg = DecodeConfig(gamma=gamma, max_new_tokens=40, sampling=s, gamma_max=gamma_max)
    policy = PolicyConfig.make("raw", eta_b=0.5, eta_c=0.5, k_min=1, s_max=16)
    jobs = _jobs(n, seed)
    want = _one_by_one(jobs, policy, cfg, error)
    got = {j.task_id: _rows(r) for j, r in decode_many(jobs[::-1], FakeDrafter(error), FakeVerifier(), policy, cfg,
                                                        batch_size=batch)}
    assert got == want


def test_the_speculative_rule_in_a_batch_draws_what_batch_one_draws():
    s = Sampling(temperature=1.0, seed=4, speculative=True)
    cfg = DecodeConfig(gamma=4, max_new_tokens=30, sampling=s)
    jobs = _jobs(5, 9)
    want = _one_by_one(jobs, PolicyConfig(name="strict"), cfg, 0.2)
    got = {j.task_id: _rows(r) for j, r in decode_many(jobs, FakeDrafter(0.2), FakeVerifier(), PolicyConfig(name="strict"),
                                                        cfg, batch_size=3)}
    assert got == want


def test_verifying_sequences_share_one_forward_and_skipped_ones_a_shadow_forward():
    """Each round makes at most one real and one shadow verifier forward, whatever the batch."""
    forwards = []

    class Counting(FakeVerifier):
        def score_many(self, calls):
            forwards.append((len(calls), calls[0].shadow))
            assert len({c.slot for c in calls}) == len(calls)  # one call per sequence
            return super().score_many(calls)

    policy = PolicyConfig.make("raw", eta_b=0.5, eta_c=0.5, k_min=1, s_max=16)
    jobs = _jobs(6, 1)
    results = list(decode_many(jobs, FakeDrafter(0.1), Counting(), policy, DecodeConfig(gamma=6, max_new_tokens=40),
                               batch_size=6))
    assert len(results) == 6 and max(n for n, _ in forwards) > 1
    assert any(shadow for _, shadow in forwards)
    calls = sum(r.verifier_calls for _, r in results)
    assert sum(n for n, shadow in forwards if not shadow) == calls and sum(1 for _, s in forwards if not s) < calls


def test_a_bad_batch_size_is_refused():
    with pytest.raises(ValueError, match="batch-size"):
        list(decode_many(_jobs(1, 0), FakeDrafter(), FakeVerifier(), PolicyConfig(name="strict"), DecodeConfig(),
                         batch_size=0))


# -- the verifier's ragged cache ---------------------------------------------------------------

def _verifier(model):
    from vskip.engine.models.verifier import HFVerifier

    return HFVerifier(model, eos_ids=[0], exact_head=False)


def _tiny_verifier(family: str):
    """A tiny randomly initialised causal LM of a verifier family we load, in float64."""
    from test_models import V, tiny_llama

    if family == "llama":
        return tiny_llama(3).double()
    import torch
    import transformers

    torch.manual_seed(3)
    name = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    cfg = getattr(transformers, f"{name}Config")(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                                  max_position_embeddings=512, tie_word_embeddings=False)
    m = getattr(transformers, f"{name}ForCausalLM")(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight.normal_(0.0, 1.0)
    return m.double()


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_each_row_of_a_ragged_forward_is_what_its_own_verifier_gives(family, packed, monkeypatch):
    """Three sequences of different lengths in three slots, over rounds that verify, reject (the
    cache cut back by lowering a row's length), skip and shadow-verify: each row's verdict equals
    that of a fresh verifier decoding the row alone (float64 model: equal to rounding), for each
    verifier family (Qwen2: biased projections; Qwen3: normed queries and keys), with the rows
    padded to the longest or packed end to end (vskip's attention, as a CPU verifier loads)."""
    from vskip.engine.models import verifier as vmod
    from vskip.engine.models.attention import use_gqa_attention

    model = _tiny_verifier(family)
    if packed:
        assert use_gqa_attention(model)
    forwards = []
    real = vmod.packed
    monkeypatch.setattr(vmod, "packed", lambda *a: forwards.append(a[2:]) or real(*a))
    batched = _verifier(model)
    assert batched.packs == packed
    batched.open_slots(3)
    seqs = [[5, 9, 2, 7, 3], [11, 4], [8, 8, 1, 6, 2, 9, 4, 7]]
    rng = np.random.default_rng(0)
    alone = [_verifier(model) for _ in seqs]
    for rnd in range(5):
        calls = []
        for slot, seq in enumerate(seqs):
            block = [int(x) for x in rng.integers(2, 90, int(rng.integers(0, 5)))]
            calls.append(Call(list(seq), block, shadow=(rnd + slot) % 3 == 0, slot=slot))
        got = batched.score_many(calls)
        for c, v in zip(calls, got):
            ref = alone[c.slot].score(c.seq, c.block, c.shadow)
            assert np.array_equal(v.tokens, ref.tokens)
            assert np.allclose(v.draft_gap, ref.draft_gap, atol=1e-9)
        for slot, c in enumerate(calls):  # commit a prefix of the block and the verifier's next token
            if not c.shadow:
                keep = int(rng.integers(0, len(c.block) + 1))
                seqs[slot] = list(c.seq) + list(c.block[:keep]) + [int(got[slot].tokens[keep])]
            else:
                seqs[slot] = list(c.seq) + list(c.block[:1])
    assert bool(forwards) == packed  # (rows of three lengths: packing had padding to save)


def test_a_forward_goes_packed_only_where_rows_differ_in_length_and_the_attention_packs():
    """packed_forward: ragged rows on a cache go packed; equal rows, one row, no cache or an attention
    that cannot pack go padded."""
    from vskip.engine.models.attention import use_gqa_attention

    model = _tiny_verifier("llama")
    assert not _verifier(model).packed_forward([3, 1])  # transformers' attention: padded
    assert use_gqa_attention(model)
    v = _verifier(model)
    assert v.packed_forward([3, 1]) and v.packed_forward([9, 1, 1])
    assert not v.packed_forward([2, 2]) and not v.packed_forward([4])
    v.set_cache(False)
    assert not v.packed_forward([3, 1])
    v.set_cache(True)
    v.pack = False
    assert not v.packed_forward([3, 1])


def test_a_subset_of_slots_reads_only_its_rows():
    """Only slots 0 and 2 verify this round: slot 1's cache is left as it was."""
    from test_models import tiny_llama

    model = tiny_llama(4).double()
    v = _verifier(model)
    v.open_slots(3)
    seqs = [[5, 9, 2], [11, 4, 6, 7], [8, 1]]
    v.score_many([Call(s, [3], slot=i) for i, s in enumerate(seqs)])
    v.score_many([Call(seqs[0] + [3], [4, 5], slot=0), Call(seqs[2] + [3], [], slot=2)])
    got = v.score_many([Call(seqs[1] + [3], [7], slot=1)])[0]
    ref = _verifier(model).score(seqs[1] + [3], [7])
    assert np.array_equal(got.tokens, ref.tokens) and np.allclose(got.draft_gap, ref.draft_gap, atol=1e-9)


# -- a run directory decoded in a batch ---------------------------------------------------------

@pytest.mark.parametrize("n", [1, 3])
def test_a_batched_run_writes_what_batch_one_writes(tmp_path, n):
    """`vskip run --batch-size 3` on the fake pair: the same samples (in prompt order once read
    back by task id) and rounds per prompt as batch 1, the batch size recorded, and a rerun resumes
    (nothing decoded twice); with 3 samples per prompt the samples of one prompt fill a batch."""
    import json
    from dataclasses import replace

    from test_rundir import _cfg
    from test_sweep import fake_pair, read_dir

    from vskip.study import runner

    one, three = tmp_path / "one", tmp_path / "three"
    runner.run(_cfg("strict", n), one, progress=False, pair=fake_pair(None, True))
    cfg = replace(_cfg("strict", n), batch_size=3, settings=None)
    runner.run(cfg, three, progress=False, pair=fake_pair(None, True))
    a, b = read_dir(one), read_dir(three)
    key = lambda s: (s["task_id"], s.get("sample", 0))  # noqa: E731
    assert sorted(a["samples"], key=key) == sorted(b["samples"], key=key)
    by = lambda rows: sorted(rows, key=lambda r: (r["task_id"], r.get("sample") or 0, r["round"]))  # noqa: E731
    assert by(a["rounds"]) == by(b["rounds"])
    assert json.loads((three / "config.json").read_text())["run"]["batch_size"] == 3
    before = (three / "rounds.jsonl").read_bytes()
    runner.run(cfg, three, progress=False, pair=fake_pair(None, True))
    assert (three / "rounds.jsonl").read_bytes() == before


# -- the drafter's rows in one forward ---------------------------------------------------------

@pytest.mark.parametrize("steps", [1, 2])
def test_drafting_several_slots_in_one_forward_gives_each_its_own_block(steps):
    """Three slots with contexts of different lengths, over rounds in which each commits a
    different number of tokens (so each brings a different amount of context along): the blocks
    drafted together equal those each slot's drafter drafts alone (float64: equal to rounding)."""
    from test_copy import tiny_drafter

    base = tiny_drafter()
    base.model.double()
    base._W = base._W.double()
    base.steps = steps
    _drafts_each_slot_as_alone(base, np.random.default_rng(1), (3, 9, 5), rounds=4)


def _drafts_each_slot_as_alone(base, rng, lengths, rounds: int) -> None:
    """``base`` (a drafter) drafting one slot per context length in one call gives, round after
    round, the blocks a copy of it drafts for each slot alone (tokens, confidences, features), the
    rows of different query lengths packed into one sequence (and padded to the longest, as
    ``pack = False`` drafts them)."""
    import copy

    alone = [copy.deepcopy(base) for _ in lengths]
    many, padded = copy.deepcopy(base), copy.deepcopy(base)
    padded.pack = False
    for d in [*alone, many, padded]:
        d.reset()
    packs = []
    many.model.register_forward_pre_hook(lambda m, args: packs.append(len(args) > 5 and args[5] is not None))
    padded.model.register_forward_pre_hook(lambda m, args: packs.append(None if len(args) > 5 and args[5] is not None
                                                                         else False))
    seqs = [[int(x) for x in rng.integers(2, 60, n)] for n in lengths]
    for _ in range(rounds):
        gammas = [int(g) for g in rng.integers(2, 8, len(seqs))]
        got = many.propose_many([(i, s, g) for i, (s, g) in enumerate(zip(seqs, gammas))], features=True)
        pad = padded.propose_many([(i, s, g) for i, (s, g) in enumerate(zip(seqs, gammas))], features=True)
        for i, (s, g) in enumerate(zip(seqs, gammas)):
            ref = alone[i].propose(s, g, features=True)
            for b in (got[i], pad[i]):
                assert b.tokens.tolist() == ref.tokens.tolist()
                assert np.allclose(b.confidence, ref.confidence, atol=1e-9)
                assert np.allclose(b.features, ref.features, atol=1e-9)
            seqs[i] = s + [int(t) for t in ref.tokens[: int(rng.integers(0, g + 1))]] + [int(rng.integers(2, 60))]
    assert None not in packs and True in packs  # the padded drafter packed nothing, the other some rows


@pytest.mark.parametrize("steps", [1, 2])
def test_a_dream_checkpoint_drafts_several_slots_as_it_drafts_each_alone(tmp_path, steps):
    """A Dream-layout checkpoint (Qwen2 names, read without its code; Dream's full attention, no
    context cache) drafting three slots in one forward per reveal step gives each slot the block it
    drafts alone (float64)."""
    from test_models import tiny_dream_dir

    from vskip.engine.models.drafter import DiffusionDrafter
    from vskip.engine.models.drafter_io import load_drafter_model

    d, _ = tiny_dream_dir(tmp_path)
    base = DiffusionDrafter(load_drafter_model(d).double(), steps=steps)
    base._W = base._W.double()
    _drafts_each_slot_as_alone(base, np.random.default_rng(2), (4, 10, 6), rounds=3)


def test_jobs_with_their_own_settings_share_a_batch_and_each_decodes_as_alone():
    """The server's case: each job brings its policy and decode settings (block length, budget,
    sampling); through one loop of three slots, each gives what its own decode gives."""
    from vskip.engine.decode import Loop

    own = [(PolicyConfig(name="strict"), DecodeConfig(gamma=6, max_new_tokens=30)),
           (PolicyConfig(name="ar"), DecodeConfig(max_new_tokens=12)),
           (PolicyConfig.make("raw", eta_b=0.6, eta_c=0.6, k_min=1), DecodeConfig(gamma=4, max_new_tokens=40)),
           (PolicyConfig(name="strict"), DecodeConfig(gamma=5, max_new_tokens=25, sampling=Sampling(0.8, seed=3))),
           (PolicyConfig.make("periodic", period=2, period_k=3), DecodeConfig(gamma=7, max_new_tokens=50)),
           (PolicyConfig(name="strict"), DecodeConfig(gamma=9, max_new_tokens=20, sampling=Sampling(1.0, 0.9, seed=5)))]
    jobs = [Job(j.prompt, j.task_id, policy=p, cfg=c) for j, (p, c) in zip(_jobs(len(own), 11), own)]
    want = {j.task_id: _rows(decode(j.prompt, FakeDrafter(0.3), FakeVerifier(), j.policy, j.cfg, task_id=j.task_id))
            for j in jobs}
    loop = Loop(FakeDrafter(0.3), FakeVerifier(), PolicyConfig(name="ar"), DecodeConfig(), batch_size=3)
    queue, got = list(jobs), {}
    while queue or loop.active:
        while queue and loop.free:
            loop.admit(queue.pop(0))
        for step in loop.round():
            assert step.error is None
            if step.result is not None:
                got[step.job.task_id] = _rows(step.result)
    assert got == want
    assert {r[1][0][9] for r in got.values()} >= {0, 6, 4}  # the blocks differed in one batch


def test_a_cancelled_sequence_frees_its_slot_and_the_others_go_on():
    from vskip.engine.decode import Loop

    cfg = DecodeConfig(gamma=6, max_new_tokens=40)
    policy = PolicyConfig(name="strict")
    jobs = _jobs(3, 5)
    loop = Loop(FakeDrafter(0.3), FakeVerifier(), policy, cfg, batch_size=2)
    a, b = loop.admit(jobs[0]), loop.admit(jobs[1])
    streamed = {a: [], b: []}
    for step in loop.round():
        streamed[step.slot] += step.committed
    part = loop.cancel(a)
    assert part.stop == "cancelled" and part.tokens == streamed[a] and loop.free == 1
    assert loop.admit(jobs[2]) == a
    got = {}
    while loop.active:
        for step in loop.round():
            if step.slot == b:
                streamed[b] += step.committed
            if step.result is not None:
                got[step.job.task_id] = step.result.tokens
    for j in jobs[1:]:
        assert got[j.task_id] == decode(j.prompt, FakeDrafter(0.3), FakeVerifier(), policy, cfg).tokens
    assert streamed[b] == got[jobs[1].task_id]  # what each round committed adds up to the result


def test_a_prompt_joining_the_batch_takes_a_forward_of_its_own():
    """Two sequences verify short blocks while a third joins with a 40-token prompt: the long row
    runs alone (two forwards, neither padded to the other's length), and every row still equals
    its own verifier's."""
    from test_models import tiny_llama

    from vskip.engine.models.ragged import padding_groups

    model = tiny_llama(6).double()
    shapes = []
    model.register_forward_hook(lambda m, args, kw, out: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    v = _verifier(model)
    v.open_slots(3)
    seqs = [[5, 9, 2, 7], [11, 4, 3]]
    v.score_many([Call(s, [], slot=i) for i, s in enumerate(seqs)])
    shapes.clear()
    prompt = [int(x) for x in np.random.default_rng(1).integers(2, 90, 40)]
    calls = [Call(seqs[0] + [6], [3, 8, 1], slot=0), Call(prompt, [], slot=2), Call(seqs[1] + [2], [7], slot=1)]
    got = v.score_many(calls)
    assert sorted(shapes) == [(1, 40), (2, 4)]
    for c, g in zip(calls, got):
        ref = _verifier(model).score(c.seq, c.block)
        assert np.array_equal(g.tokens, ref.tokens) and np.allclose(g.draft_gap, ref.draft_gap, atol=1e-9)
    assert padding_groups([9, 9, 150, 9]) == [[0, 1, 3], [2]]
    assert padding_groups([150, 140, 160]) == [[0, 1, 2]]  # all prompts: one forward
    assert padding_groups([9, 30, 1]) == [[0, 1, 2]]  # within the floor
    assert padding_groups([1, 1, 17]) == [[0, 1], [2]]


def test_a_prompt_joining_the_drafters_batch_drafts_in_forwards_of_its_own():
    """Two slots draft from cached contexts while a third brings a 40-token prompt: the long row
    drafts alone, and every block equals its own drafter's."""
    import copy

    from test_copy import tiny_drafter

    base = tiny_drafter()
    base.model.double()
    base._W = base._W.double()
    many = copy.deepcopy(base)
    many.reset()
    rng = np.random.default_rng(2)
    seqs = [[int(x) for x in rng.integers(2, 60, n)] for n in (6, 8)]
    many.propose_many([(i, s, 4) for i, s in enumerate(seqs)])
    seqs = [s + [7, 9] for s in seqs]
    prompt = [int(x) for x in rng.integers(2, 60, 40)]
    shapes = []
    many.model.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    got = many.propose_many([(0, seqs[0], 4), (2, prompt, 4), (1, seqs[1], 4)])
    # per reveal step (two): the prompt's row alone, its 39 context tokens riding along the first
    # step with the last token and the block of 4; the cached rows together, 2 new context tokens each
    assert many.steps == 2 and sorted(shapes) == [(1, 5), (1, 44), (2, 5), (2, 7)]
    for g, s in zip(got, [seqs[0], prompt, seqs[1]]):
        d = copy.deepcopy(base)
        d.reset()
        ref = d.propose(s, 4)
        assert g.tokens.tolist() == ref.tokens.tolist() and np.allclose(g.confidence, ref.confidence, atol=1e-9)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
@pytest.mark.parametrize("chunk", [1, 3, 50])
def test_a_chunked_prefill_decodes_each_prompt_as_batch_one_does(policy, chunk):
    """Prompts read a chunk at a time (at most ``chunk`` prompt tokens a round, first come first)
    decode exactly as batch 1 does; every prompt is read to its last-but-one token, and the drafter
    reads what the verifier reads, chunk for chunk."""
    from collections import deque

    from vskip.engine.decode import Loop

    cfg = DecodeConfig(gamma=6, max_new_tokens=30, task="humaneval", trace=policy.learned)
    jobs = _jobs(7, 5)
    want = _one_by_one(jobs, policy, cfg, 0.3)
    verifier, drafter = FakeVerifier(), FakeDrafter(0.3)
    loop = Loop(drafter if policy.uses_drafter else None, verifier, policy, cfg,
                StubPredictor(2.0) if policy.learned else None, batch_size=3, prefill_chunk=chunk)
    queue, got, read = deque(jobs), {}, {}
    while queue or loop.active:
        while queue and loop.free:
            job = queue.popleft()
            read[loop.admit(job)] = (job.task_id, 0)
        before = len(getattr(verifier, "prefilled", []))
        steps = loop.round()
        this_round = 0
        for slot, n in getattr(verifier, "prefilled", [])[before:]:
            this_round += n - read[slot][1]
            read[slot] = (read[slot][0], n)
        assert this_round <= chunk
        for st in steps:
            if st.result is not None:
                got[st.job.task_id] = _rows(st.result)
                assert read[st.slot] == (st.job.task_id, len(st.job.prompt) - 1)
    assert got == want
    if policy.uses_drafter:
        assert drafter.prefilled == verifier.prefilled


def test_a_long_prompt_read_in_chunks_never_stalls_the_running_sequences():
    """A 25-token prompt joins a running sequence with a chunk of 8: the running one decodes in every
    round while the long one reads 8 tokens a round; in the round that reads its last chunk, it
    decodes too."""
    from vskip.engine.decode import Loop

    verifier = FakeVerifier()
    loop = Loop(FakeDrafter(0.3), verifier, PolicyConfig(name="strict"), DecodeConfig(gamma=4, max_new_tokens=200),
                batch_size=2, prefill_chunk=8)
    a = loop.admit(Job([5, 6, 7], task_id="short"))
    assert [s.slot for s in loop.round()] == [a]
    b = loop.admit(Job(list(range(10, 35)), task_id="long"))
    seen = []
    for _ in range(5):
        seen.append(([s.slot for s in loop.round()], loop.reading))
    assert seen == [([a], 1)] * 2 + [([a, b], 0)] * 3  # 24 tokens read, 8 a round; the 25th is its first round's
    assert [n for s, n in verifier.prefilled if s == b] == [8, 16, 24]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_crowded_batch_verifies_strict_sdd_without_drafts_and_its_text_does_not_change(temperature):
    """With ``draft_max_batch`` 2, a round of more than two sequences verifies the Strict SDD ones
    with no draft (gamma 0) while a skipping policy's sequence still drafts; every text equals its
    batch-1 decode. Past the crowd (two sequences left), Strict SDD drafts again."""
    from dataclasses import replace

    from vskip.engine.decode import Loop

    cfg = replace(DecodeConfig(gamma=6, max_new_tokens=60), sampling=Sampling(temperature=temperature, seed=1))
    strict, raw = PolicyConfig(name="strict"), PolicyConfig.make("raw", eta_b=0.6, eta_c=0.6, k_min=1, s_max=12)
    jobs = [Job(j.prompt, j.task_id, policy=raw if i == 0 else strict) for i, j in enumerate(_jobs(4, 8))]
    want = {j.task_id: decode(j.prompt, FakeDrafter(0.3), FakeVerifier(), j.policy, cfg, task_id=j.task_id).tokens
            for j in jobs}
    loop = Loop(FakeDrafter(0.3), FakeVerifier(), strict, cfg, batch_size=4, draft_max_batch=2)
    for j in jobs:
        loop.admit(j)
    got, crowded = {}, []
    while loop.active:
        n = len(loop.active)
        for st in loop.round():
            if st.record is not None:
                crowded.append((n > 2, st.job.policy.name, st.record.gamma))
            if st.result is not None:
                got[st.job.task_id] = st.result.tokens
    assert got == want
    assert {g for c, name, g in crowded if c and name == "strict"} == {0}
    assert all(g > 0 for c, name, g in crowded if name == "raw")
    assert any(g > 0 for c, name, g in crowded if not c and name == "strict")


def test_a_chunk_deep_in_a_prompt_holds_fewer_tokens():
    """With a chunk of 8 and a depth of 8, a token of a chunk starting at depth d counts 1 + d/8:
    the prompt is read 8, then 4, 3, 2, 2 ... tokens a round, and decodes as batch 1 does."""
    from vskip.engine.decode import Loop

    prompt, cfg = list(range(10, 40)), DecodeConfig(gamma=4, max_new_tokens=6)
    verifier = FakeVerifier()
    loop = Loop(FakeDrafter(0.3), verifier, PolicyConfig(name="strict"), cfg, batch_size=1, prefill_chunk=8,
                prefill_depth=8)
    loop.admit(Job(prompt, task_id="long"))
    tokens = []
    while loop.active:
        tokens += [t for s in loop.round() for t in s.committed]
    reads = [n for _, n in verifier.prefilled]
    assert reads[:6] == [8, 12, 15, 17, 19, 21] and reads[-1] == len(prompt) - 1
    assert tokens == decode(prompt, FakeDrafter(0.3), FakeVerifier(), PolicyConfig(name="strict"), cfg).tokens
