"""`vskip compare`: configuration specs, paired rows with resume, and the summary against ar."""

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from fakes import FakeDrafter, FakeVerifier

from vskip.engine.decode import DecodeConfig
from vskip.study import compare, compare_summary
from vskip.study import variants as parsing

BASE = DecodeConfig(gamma=8, max_new_tokens=40)


def test_parse_variant():
    v = parsing.parse_variant("strict", BASE, 1)
    assert (v.policy, v.decode.gamma, v.decode.gamma_max, v.steps) == ("strict", 8, None, 1)
    v = parsing.parse_variant("strict+gamma=4+gamma_max=16+min_match=6+trim=0.5+steps=2", BASE, 1)
    assert (v.decode.gamma, v.decode.gamma_max, v.decode.min_match, v.decode.trim, v.steps) == (4, 16, 6, 0.5, 2)
    v = parsing.parse_variant("raw+gamma=12", BASE, 1)
    assert (v.policy, v.decode.gamma, v.decode.gamma_max) == ("raw", 12, None)
    assert parsing.parse_variant("lookup10", BASE, 1).lookup == 10
    assert parsing.parse_variant("hf", BASE, 1).hf
    fast = parsing.parse_variant("fast", BASE, 1)
    assert fast.name == "fast" and fast.decode == parsing.parse_variant(parsing.FAST, BASE, 1).decode
    for bad in ("nope", "strict+", "lookup0", "lookupx", "strict+gamma", "strict+gamma=x", "strict+foo=1",
                "strict+steps=0", "strict+gamma=0", "strict+trim=2"):
        with pytest.raises(ValueError):
            parsing.parse_variant(bad, BASE, 1)
    with pytest.raises(ValueError, match="give --predictor DIR"):
        parsing.parse_variant("marginal", BASE, 1)


def test_a_configuration_may_take_the_speculative_rule(tmp_path):
    """strict+speculative=on samples its drafts and accepts with min(1, p/q) beside plain strict in
    the same comparison; the rule needs sampling, and it leaves the command's other settings as
    they are."""
    from dataclasses import replace

    from vskip.engine.policy import Sampling

    warm = replace(BASE, sampling=Sampling(temperature=0.8, seed=4))
    v = parsing.parse_variant("strict+speculative=on+gamma=4", warm, 1)
    assert v.decode.sampling == Sampling(temperature=0.8, seed=4, speculative=True) and v.decode.gamma == 4
    assert not parsing.parse_variant("strict", warm, 1).decode.sampling.speculative
    with pytest.raises(ValueError, match="temperature"):
        parsing.parse_variant("strict+speculative=on", BASE, 1)
    with pytest.raises(ValueError, match="on or off"):
        parsing.parse_variant("strict+speculative=maybe", warm, 1)
    prompts = [(f"t{i}", [7, 3, 9, i + 2]) for i in range(4)]
    chosen = [parsing.parse_variant(s, warm, 1) for s in ("ar", "strict", "strict+speculative=on")]
    rows = compare.read_rows(compare.run_compare(prompts, _pair(), chosen, tmp_path, progress=False))
    by = {(r.task_id, r.config): r for r in rows}
    assert all(by[(t, "strict")].tokens == by[(t, "ar")].tokens for t, _ in prompts)  # the coupled rule
    assert all(by[(t, "strict+speculative=on")].result.generated_tokens > 0 for t, _ in prompts)


def _pair():
    return SimpleNamespace(drafter=FakeDrafter(0.3, 2), verifier=FakeVerifier(), runtime=None, extra_drafters={})


def test_rows_pair_every_prompt_and_resume(tmp_path):
    prompts = [(f"t{i}", [7, 3, 9, i + 2]) for i in range(5)]
    chosen = [parsing.parse_variant(s, BASE, 1) for s in ("ar", "strict", "strict+gamma=4+gamma_max=12+min_match=3+trim=0.6")]
    path = compare.run_compare(prompts, _pair(), chosen, tmp_path, progress=False)
    rows = compare.read_rows(path)
    assert sorted((r.task_id, r.config) for r in rows) == sorted(
        (t, v.name) for t, _ in prompts for v in chosen)
    # the order of configurations rotates from prompt to prompt
    firsts = [rows[3 * k].config for k in range(3)]
    assert firsts == ["ar", "strict", "strict+gamma=4+gamma_max=12+min_match=3+trim=0.6"]
    # a cut line and a missing row are redone, nothing is counted twice
    text = path.read_text().splitlines()
    path.write_text("\n".join(text[:-2]) + "\n" + text[-2][: len(text[-2]) // 2])
    compare.run_compare(prompts, _pair(), chosen, tmp_path, progress=False)
    rows = compare.read_rows(path)
    assert len({(r.task_id, r.config) for r in rows}) == len(rows) == 15
    s = compare_summary.summarize_comparison(rows)
    import gzip

    (tmp_path / "archived").mkdir()
    (tmp_path / "archived" / (path.name + ".gz")).write_bytes(gzip.compress(path.read_bytes()))
    assert compare_summary.summarize_comparison(compare_summary.rows_of(tmp_path / "archived")) == s
    assert s["n_prompts"] == 5
    # Strict SDD is lossless with either block length rule
    assert s["configs"]["strict"]["same_as_ar"] == s["configs"]["strict+gamma=4+gamma_max=12+min_match=3+trim=0.6"]["same_as_ar"] == 5
    assert s["configs"]["ar"]["ratio_vs_ar"] == pytest.approx(1.0)
    assert s["configs"]["strict"]["tokens_per_call"] > 1
    acc = [x for r in rows if r.config == "strict" for x in r.accepted]
    assert s["configs"]["strict"]["p_L_ge1"] == pytest.approx(sum(x >= 1 for x in acc) / len(acc))
    assert "× ar" in compare_summary.format_summary(s)
    # every row names the machine it was timed on, and the printed table ends with it
    assert len(s["machines"]) == 1 and "prompts_split_across_machines" not in s
    assert compare_summary.format_summary(s).splitlines()[-1] == f"Machine: {s['machines'][0]}."
    bare = compare_summary.summarize_comparison([replace(r, machine=None) for r in rows])
    assert "machines" not in bare and "Machine: not recorded" in compare_summary.format_summary(bare).splitlines()[-1]


def test_the_summary_never_pairs_two_machines_clocks_and_marks_rows_from_several(tmp_path):
    """A prompt whose configurations were timed on different machines is left out of every ratio
    (refused, and counted); whole prompts timed on another machine are paired there, and the last
    line of the printed table names each machine with its prompts and marks the mix."""
    rows = _rows([{"task_id": f"t{i}", "config": c, "repeat": 0, "machine": "EPYC (AVX2)", "generated_tokens": 10,
                   "decode_seconds": sec, "digest": "d", "tokens": [1]}
                  for i in range(4) for c, sec in (("ar", 2.0), ("strict", 1.0))])
    one = compare_summary.summarize_comparison(rows)
    assert one["n_prompts"] == 4 and one["configs"]["strict"]["ratio_vs_ar"] == pytest.approx(2.0)
    # four prompts are too few for a bootstrap interval (35 distinct resamples): each prompt's ratio instead
    assert one["configs"]["strict"]["ratio_by_prompt"] == pytest.approx({f"t{i}": 2.0 for i in range(4)})
    assert "4 prompts are too few for a bootstrap interval over prompts; × ar by prompt:\n- strict: 2.000, 2.000" in (
        compare_summary.format_summary(one))
    # prompt t0's Strict SDD row comes from a machine twice as fast: pairing it would bias the ratio
    split = [replace(r, machine="Xeon (AMX)", result=replace(r.result, decode_seconds=0.5))
             if (r.task_id, r.config) == ("t0", "strict") else r for r in rows]
    s = compare_summary.summarize_comparison(split)
    assert s["n_prompts"] == 3 and s["prompts_split_across_machines"] == 1
    assert s["configs"]["strict"]["ratio_vs_ar"] == pytest.approx(2.0)  # t0 left out, not paired across machines
    last = compare_summary.format_summary(s).splitlines()[-1]
    assert last.startswith("Machines (mixed): ") and "1 prompts timed on several machines left out" in last
    # whole prompts on another machine: each paired on its own machine, the mix marked
    moved = [replace(r, machine="Xeon (AMX)") if r.task_id in ("t0", "t1") else r for r in rows]
    s = compare_summary.summarize_comparison(moved)
    assert s["n_prompts"] == 4 and s["prompts_by_machine"] == {"EPYC (AVX2)": 2, "Xeon (AMX)": 2}
    assert "EPYC (AVX2) (2 prompts); Xeon (AMX) (2 prompts)" in compare_summary.format_summary(s).splitlines()[-1]
    # an id an earlier vskip wrote (a hash of the machine's record) is named by its record
    legacy = [replace(r, machine="fab443138af2") for r in rows]
    assert compare_summary.format_summary(compare_summary.summarize_comparison(legacy)).splitlines()[-1] == (
        "Machine: AMD EPYC (AVX2); 2 cores.")


def test_the_summary_gives_the_agreement_of_a_skipping_configuration(tmp_path):
    """StrictToken and FullPrefix from compare's rows are the runner's (one function sums them),
    shown only where a configuration committed drafted tokens by a relaxed rule."""
    from vskip.engine.decode import decode
    from vskip.engine.metrics import agreement_from_rounds

    prompts = [(f"t{i}", [7, 3, 9, i + 2]) for i in range(4)]
    chosen = [parsing.parse_variant(s, BASE, 1) for s in ("ar", "strict", "raw+eta_b=0.1+eta_c=0.1+k_min=1")]
    rows = compare.read_rows(compare.run_compare(prompts, _pair(), chosen, tmp_path, progress=False))
    s = compare_summary.summarize_comparison(rows)
    raw = s["configs"][chosen[2].name]
    rounds = [r for _, ids in prompts for r in decode(ids, _pair().drafter, _pair().verifier, chosen[2].policy_config(),
                                                        chosen[2].decode).rounds]
    st, fp, n = agreement_from_rounds(rounds)
    assert n > 0 and raw["relaxed_rounds"] == n
    assert (raw["strict_token"], raw["full_prefix"]) == pytest.approx((st, fp))
    assert s["configs"]["strict"]["strict_token"] == 1.0 and s["configs"]["strict"]["relaxed_rounds"] == 0
    assert "StrictToken" in compare_summary.format_summary(s)
    old = compare_summary.summarize_comparison([replace(r, agreement=None) for r in rows])
    assert "strict_token" not in old["configs"]["strict"] and "StrictToken" not in compare_summary.format_summary(old)


def _rows(dicts) -> list:
    """Rows as a shard file holds them, read back."""
    return [compare.CompareRow.from_json(d) for d in dicts]


def test_summary_reports_where_outputs_diverge():
    rows = [
        {"task_id": "a", "config": "ar", "generated_tokens": 4, "decode_seconds": 1.0, "tokens": [1, 2, 3, 4]},
        {"task_id": "b", "config": "ar", "generated_tokens": 3, "decode_seconds": 1.0, "tokens": [5, 6, 7]},
        {"task_id": "a", "config": "x", "generated_tokens": 4, "decode_seconds": 0.5, "tokens": [1, 2, 9, 4]},
        {"task_id": "b", "config": "x", "generated_tokens": 3, "decode_seconds": 0.5, "tokens": [5, 6, 7]},
    ]
    for r in rows:
        r["digest"] = compare._digest(r["tokens"])
    s = compare_summary.summarize_comparison(_rows(rows))["configs"]["x"]
    assert s["same_as_ar"] == 1 and s["first_divergence"] == {"n": 1, "median": 2.0, "min": 2}
    assert s["ratio_vs_ar"] == pytest.approx(2.0)


def test_rows_written_before_the_record_read_as_it(tmp_path):
    """Rows written with compare's old names (seconds, calls, blocks, skipped; tokens the count and
    output the ids) read as rows in the record's names, which a resume writes back; a damaged row
    is named as the file spells it."""
    old = {"task_id": "a", "config": "strict", "repeat": 1, "machine": "m", "prompt_tokens": 5, "seconds": 2.0,
           "calls": 3, "blocks": 4, "draft_seconds": 0.5, "verify_seconds": 1.0, "skipped": 0, "accepted": [2, 1],
           "agreement": [0, 0, 0, 0], "tokens": 3, "digest": "d", "output": [4, 5, 6]}
    new = {"task_id": "a", "config": "strict", "repeat": 1, "machine": "m", "prompt_tokens": 5, "generated_tokens": 3,
           "decode_seconds": 2.0, "verifier_calls": 3, "draft_blocks": 4, "skipped_rounds": 0, "draft_seconds": 0.5,
           "verify_seconds": 1.0, "accepted": [2, 1], "agreement": [0, 0, 0, 0], "digest": "d", "tokens": [4, 5, 6]}
    row = compare.CompareRow.from_json(old)
    assert row == compare.CompareRow.from_json(new) and row.to_json() == new
    assert row.result.verifier_calls == 3 and row.tokens == [4, 5, 6]
    hf = compare.CompareRow.from_json({"task_id": "a", "config": "hf", "seconds": 1.5, "tokens": 2, "output": [1, 2]})
    assert hf.result.verifier_calls is None and hf.to_json()["generated_tokens"] == 2
    assert "verifier_calls" not in hf.to_json()
    path = tmp_path / "shard-1-of-1.jsonl"
    for bad, needle in (({"seconds": 0}, "line 1 has seconds 0"), ({"calls": -1}, "line 1 has calls -1")):
        path.write_text(json.dumps(old | bad) + "\n")
        with pytest.raises(compare.FileError, match=needle):
            compare.read_rows(path)
    path.write_text("\n" + json.dumps(new | {"decode_seconds": -1.0}) + "\n")
    with pytest.raises(compare.FileError, match="line 2 has decode_seconds -1.0"):
        compare.read_rows(path)


_RESULTS = Path(__file__).parents[1] / "docs" / "results"
#: every committed comparison: a directory of shard files with its summary
_COMPARISONS = sorted({p.parent.relative_to(_RESULTS).as_posix() for p in _RESULTS.rglob("shard-*.jsonl*")})


@pytest.mark.parametrize("where", _COMPARISONS)
def test_every_archived_comparison_rebuilds_its_summary_byte_for_byte(where):
    """Each committed comparison's rows (speed/he164's written before compare shared the record
    with run, and before rows named their machine), read back with its scores where it was scored,
    give its committed summary.json and summary.md as they are (`vskip compare --summary`), the
    table ending with the line that names the machine."""
    d = _RESULTS / where
    scores = json.loads((d / "scores.json").read_text()) if (d / "scores.json").exists() else None
    s = compare_summary.summarize_comparison(compare_summary.rows_of(d), scores)
    assert json.dumps(s, indent=1) + "\n" == (d / "summary.json").read_text()
    assert compare_summary.format_summary(s) + "\n" == (d / "summary.md").read_text()


def test_every_configuration_is_set_against_every_other():
    """`pairwise[a][b]`: a's ΣN/ΣT over b's on the same prompts, with its interval and each
    repeat's ratio; the printed table adds × strict where Strict SDD is in the comparison."""
    rows = []
    for t, n in (("a", 40), ("b", 20), ("c", 30)):
        for q in range(2):
            for name, sec in (("ar", 4.0), ("strict", 2.0), ("x", 1.0 + q)):  # x: twice strict's speed, then 2/3
                rows.append({"task_id": t, "config": name, "repeat": q, "generated_tokens": n,
                             "decode_seconds": sec * n / 10, "digest": "d", "tokens": [1]})
    rows = _rows(rows)
    s = compare_summary.summarize_comparison(rows)
    pw = s["pairwise"]
    assert set(pw) == {"ar", "strict", "x"} and set(pw["x"]) == {"ar", "strict"}
    assert pw["strict"]["ar"]["ratio"] == pytest.approx(s["configs"]["strict"]["ratio_vs_ar"]) == pytest.approx(2.0)
    assert pw["x"]["strict"]["by_repeat"] == pytest.approx([2.0, 1.0])
    assert pw["x"]["strict"]["ratio"] == pytest.approx((180 / 27) / (180 / 36))  # pooled over repeats: 4/3
    assert pw["x"]["strict"]["ratio"] * pw["strict"]["x"]["ratio"] == pytest.approx(1.0)
    lo, hi = pw["x"]["strict"]["ci95"]
    assert lo == pytest.approx(hi) == pytest.approx(4 / 3)  # every prompt has the same ratio
    text = compare_summary.format_summary(s)
    assert "× strict" in text and "- x: 2.000, 1.000" in text.split("× strict by repeat:")[1]
    no_strict = compare_summary.summarize_comparison([r for r in rows if r.config != "strict"])
    assert "× strict" not in compare_summary.format_summary(no_strict)
    old = {k: v for k, v in s.items() if k != "pairwise"}  # a summary written before pairs existed
    assert "× strict" not in compare_summary.format_summary(old)
    with pytest.raises(ValueError):
        compare_summary.summarize_comparison([r for r in rows if r.config == "x"])


def test_the_summary_sets_calls_and_blocks_against_strict_and_reads_eq8():
    """rel. calls and blocks are per generated token over Strict SDD's on the same prompts, and
    K* = A c_D / (c_D + c_V) comes from Strict SDD's measured costs (A its tokens per call)."""
    rows = []
    for t, n in (("a", 40), ("b", 20)):
        for name, calls, blocks, toks in (("ar", n, 0, n), ("strict", n // 4, n // 4, n), ("x", n // 8, n // 2, n // 2)):
            rows.append({"task_id": t, "config": name, "generated_tokens": toks, "decode_seconds": 1.0, "digest": "d",
                         "tokens": [1], "verifier_calls": calls, "draft_blocks": blocks,
                         "accepted": [3] * blocks if name == "strict" else [],
                         "draft_seconds": 0.01 * blocks, "verify_seconds": (0.02 if name == "ar" else 0.03) * calls})
        rows.append({"task_id": t, "config": "hf", "generated_tokens": n, "decode_seconds": 1.0, "digest": "d",
                     "tokens": [1]})
    rows = _rows(rows)
    s = compare_summary.summarize_comparison(rows)
    x, st = s["configs"]["x"], s["configs"]["strict"]
    # transformers' decoders record no calls: neither relative measure exists for them
    assert s["configs"]["hf"]["rel_calls"] is None and s["configs"]["hf"]["rel_blocks"] is None
    assert st["rel_calls"] == pytest.approx(1.0) and st["rel_blocks"] == pytest.approx(1.0)
    assert x["rel_calls"] == pytest.approx((7 / 30) / (15 / 60))  # 5 + 2 calls for 30 tokens, 10 + 5 for 60
    assert x["rel_blocks"] == pytest.approx((30 / 30) / (15 / 60))
    assert x["rel_calls_ci95"][0] <= x["rel_calls"] <= x["rel_calls_ci95"][1]
    # ar drafts no blocks: no relative blocks at all (shown as "–"), never 0
    assert s["configs"]["ar"]["rel_blocks"] is None and s["configs"]["ar"]["rel_calls"] == pytest.approx(4.0)
    assert s["eq8"]["A"] == pytest.approx(4.0)  # 60 tokens in 15 calls
    assert s["eq8"]["K_star"] == pytest.approx(4.0 * 10 / (10 + 30))  # c_D 10 ms, c_V 30 ms
    # Eq. 7: ar pays c_V(ar) = 20 ms a token; Strict SDD (c_D + c_V) / A = (10 + 30) / 4 ms
    p = compare_summary.eq7(s)
    assert p["verify_over_step"] == pytest.approx(1.5) and p["predicted_vs_ar"] == pytest.approx(4.0 * 20 / (10 + 30))
    text = compare_summary.format_summary(s)
    assert "rel. calls [95% CI]" in text and "K* = A c_D / (c_D + c_V) = 1.000" in text
    assert "a verification costs 1.50 ar steps" in text and "gives Strict SDD A c_V(ar) / (c_D + c_V) = 2.000× ar" in text
    hf_row = next(line for line in text.splitlines() if line.startswith("| hf "))
    assert "0.000" not in hf_row
    # rounds that draft from the copy hint or not at all: b drafts per verification, not 1
    s["eq8"]["blocks_per_call"] = 0.25
    p = compare_summary.eq7(s)
    assert p["predicted_vs_ar"] == pytest.approx(4.0 * 20 / (0.25 * 10 + 30))
    assert "with b = 0.250 drafts per verification" in compare_summary.format_summary(s)
    no_strict = compare_summary.summarize_comparison([r for r in rows if r.config != "strict"])
    assert "eq8" not in no_strict and "rel. calls" not in compare_summary.format_summary(no_strict)


def test_an_out_directory_refuses_rows_made_otherwise(tmp_path):
    from vskip.engine.models.config import ModelConfig
    from vskip.engine.runtime import Runtime

    def record(max_new=40, gamma=8, configs=("ar", "strict")):
        dec = DecodeConfig(gamma=gamma, max_new_tokens=max_new)
        vs = [parsing.parse_variant(s, dec, 1) for s in configs]
        return compare.settings_record("humaneval", max_new, Runtime(), ModelConfig(), vs)

    out = tmp_path / "cmp"
    compare.claim(out, record())
    compare.claim(out, record())  # the same settings: resume
    compare.claim(out, record(configs=("ar", "fast")))  # a configuration added
    saved = json.loads((out / "settings.json").read_text())
    assert set(saved["configs"]) == {"ar", "strict", "fast"}
    with pytest.raises(ValueError, match="max_new_tokens"):
        compare.claim(out, record(max_new=64))
    with pytest.raises(ValueError, match="strict"):
        compare.claim(out, record(gamma=16))  # strict now means another block length
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        compare.claim(tmp_path / "file", record())
    (out / "settings.json").write_text("{broken")
    with pytest.raises(ValueError, match="settings file"):
        compare.claim(out, record())


def test_a_policy_configuration_takes_its_own_parameters_and_the_commands():
    v = parsing.parse_variant("raw+eta_b=0.7+eta_c=0.7+k_min=3", BASE, 1)
    p = v.policy_config()
    assert (p.name, p.eta_b, p.eta_c, p.k_min) == ("raw", 0.7, 0.7, 3) and v.cache is None
    # only what differs from the policy's defaults is recorded, so old records still match
    assert dict(v.params) == {"eta_b": 0.7, "eta_c": 0.7, "k_min": 3}
    assert parsing.parse_variant("raw", BASE, 1).params == ()
    # the command's flags are the starting point; the entry's own parameters win; ar and strict have none
    flags = {"k_min": 3, "eta_b": 0.8}
    assert parsing.parse_variant("raw+eta_b=0.6", BASE, 1, None, flags).policy_config().eta_b == 0.6
    assert parsing.parse_variant("raw", BASE, 1, None, flags).policy_config().k_min == 3
    assert parsing.parse_variant("strict", BASE, 1, None, flags).params == ()
    v = parsing.parse_variant("prefix+lam=0.7+cost_ratio=0.3+cache=off", BASE, 1)
    assert (v.policy_config().lam, v.policy_config().cost_ratio, v.cache) == (0.7, 0.3, False)
    assert parsing.parse_variant("ar+cache=off", BASE, 1).cache is False
    v = parsing.parse_variant("prefix+alpha=0.05", BASE, 1, "pred")
    assert v.policy_config().survival == "model" and v.policy_config().learned
    assert parsing.parse_variant("marginal+eta_m=0.9", BASE, 1, "pred").policy_config().eta_c == 0.9
    for bad, needle in (("prefix+alpha=0.05", "give --predictor"), ("strict+eta_b=0.5", "no parameters"),
                        ("raw+eta_b=2", "eta_b"), ("raw+cache=maybe", "on or off"), ("raw+k_min=x", "bad value"),
                        ("raw+alpha=0.1", "prefix"), ("raw+bogus=1", "bad setting")):
        with pytest.raises(ValueError, match=needle):
            parsing.parse_variant(bad, BASE, 1)


class CacheVerifier(FakeVerifier):
    """Records the cache switches; decoding checks the switch is on or off as asked."""

    def __init__(self):
        super().__init__()
        self.use_cache, self.switches, self.seen = True, [], set()

    def set_cache(self, on):
        self.use_cache = on
        self.switches.append(on)

    def score(self, seq, block, shadow=False):
        self.seen.add(self.use_cache)
        return super().score(seq, block, shadow)


def test_repeats_rotate_and_give_each_repeats_ratio(tmp_path):
    prompts = [(f"t{i}", [7, 3, 9, i + 2]) for i in range(4)]
    variants = [parsing.parse_variant(s, BASE, 1) for s in ("ar", "strict", "strict+cache=off")]
    pair = SimpleNamespace(drafter=FakeDrafter(0.3, 2), verifier=CacheVerifier(), runtime=None, extra_drafters={})
    path = compare.run_compare(prompts, pair, variants, tmp_path, progress=False, repeats=2)
    rows = compare.read_rows(path)
    assert sorted((r.task_id, r.config, r.repeat) for r in rows) == sorted(
        (t, v.name, q) for t, _ in prompts for v in variants for q in range(2))
    # the first configuration moves on at every repeat of every prompt
    assert [rows[3 * k].config for k in range(4)] == ["ar", "strict", "strict+cache=off", "ar"]
    # the cache is switched off for that configuration only, and back on after it
    assert pair.verifier.seen == {True, False} and pair.verifier.switches == [False, True] * 8
    s = compare_summary.summarize_comparison(rows)
    assert s["repeats"] == 2 and s["n_prompts"] == 4
    for name in ("strict", "strict+cache=off"):
        d = s["configs"][name]
        assert d["same_as_ar"] == 4 and len(d["ratio_by_repeat"]) == 2
        assert min(d["ratio_by_repeat"]) <= d["ratio_vs_ar"] <= max(d["ratio_by_repeat"])
    assert "× ar by repeat" in compare_summary.format_summary(s)
    # a prompt missing one repeat of one configuration is left out of the summary
    partial = [r for r in rows if not (r.task_id == "t3" and r.config == "strict" and r.repeat == 1)]
    assert compare_summary.summarize_comparison(partial)["n_prompts"] == 3
    # resume: nothing is decoded again
    before = len(pair.verifier.switches)
    compare.run_compare(prompts, pair, variants, tmp_path, progress=False, repeats=2)
    assert len(pair.verifier.switches) == before and len(compare.read_rows(path)) == 24
    # the switch is put back after each configuration that sets it
    assert pair.verifier.use_cache is True


def test_a_learned_configuration_reads_its_predictor(tmp_path, monkeypatch):
    import vskip.study.predictor

    asked, scored = [], []

    class Half:
        def scores(self, block, features, task_id=None):
            scored.append(task_id)
            return [0.999] * len(block.tokens)

    monkeypatch.setattr(vskip.study.predictor, "load_predictor", lambda d, kind, runtime=None: asked.append((d, kind)) or Half())
    variants = [parsing.parse_variant(s, BASE, 1, "pred") for s in ("ar", "marginal+eta_m=0.5+k_min=1", "strict")]
    path = compare.run_compare([("t0", [7, 3, 9, 2])], _pair(), variants, tmp_path, progress=False, predictor="pred")
    assert asked == [("pred", "marginal")] and set(scored) == {"t0"}
    rows = {r.config: r.result for r in compare.read_rows(path)}
    assert rows["marginal+eta_m=0.5+k_min=1"].skipped_rounds > 0 and rows["strict"].skipped_rounds == 0


def test_a_configuration_may_name_its_own_predictor(tmp_path, monkeypatch):
    """Two rounds of one model side by side: `predictor=DIR` in a configuration loads that directory
    for it alone; the others read --predictor, each (kind, directory) loaded once, and the settings
    record which directory each configuration read."""
    import vskip.study.predictor

    class Sure:
        kind, online = "conditional", None

        def __init__(self, q):
            self.q = q

        def scores(self, block, features, task_id=None):
            return [self.q] * len(block.tokens)

        def threshold(self, task_id, alpha):
            return 0.5

    asked = []
    monkeypatch.setattr(vskip.study.predictor, "load_predictor",
                        lambda d, kind, runtime=None: asked.append((d, kind)) or Sure(0.999 if d == "pred" else 0.0))
    specs = ("ar", "prefix+alpha=0.05", "prefix+alpha=0.05+predictor=round2", "prefix+alpha=0.02+predictor=round2")
    variants = [parsing.parse_variant(s, BASE, 1, "pred") for s in specs]
    assert [v.predictor for v in variants] == [None, None, "round2", "round2"]
    assert variants[1].params == variants[2].params  # the same policy; only the model differs
    path = compare.run_compare([("t0", [7, 3, 9, 2])], _pair(), variants, tmp_path, progress=False, predictor="pred")
    assert asked == [("pred", "prefix"), ("round2", "prefix")]
    rows = {r.config: r.result for r in compare.read_rows(path)}
    assert rows[specs[1]].skipped_rounds > 0 and rows[specs[2]].skipped_rounds == rows[specs[3]].skipped_rounds == 0
    from vskip.engine.models.config import ModelConfig

    rec = compare.settings_record("humaneval", 24, ModelConfig(), ModelConfig(), variants, "pred")
    assert rec["configs"][specs[2]]["predictor"] == "round2" and "predictor" not in rec["configs"][specs[1]]
    # without --predictor, every learned configuration must name its own
    assert parsing.parse_variant(specs[2], BASE, 1).predictor == "round2"
    for bad, needle in ((specs[1], "give --predictor"), ("raw+predictor=round2", "reads none"),
                        ("prefix+alpha=0.05+predictor=", "bad setting")):
        with pytest.raises(ValueError, match=needle):
            parsing.parse_variant(bad, BASE, 1)


def test_a_shard_without_prompts_ends_at_once(tmp_path, capsys, monkeypatch):
    """More shards than prompts: the idle shard says so and exits 0 before any model loads."""
    import vskip.engine.door
    from vskip.cli import main

    monkeypatch.setattr(vskip.engine.door, "open_models", lambda *a, **k: pytest.fail("a model was loaded"))
    rc = main(["compare", "--task", "humaneval", "--ids", "HumanEval/0", "--configs", "ar,strict",
               "--shard", "2/2", "--out", str(tmp_path / "c"), "--quiet"])
    assert rc == 0 and "shard 2/2 has no prompts of the 1 selected" in capsys.readouterr().out


def test_a_configuration_drafts_with_its_own_drafter_and_each_drafter_warms_up_with_its_blocks(tmp_path):
    """``drafter=NAME`` decodes with that drafter; the command's drafter never sees another
    drafter's block length (a conditioned drafter refuses blocks beyond its size)."""

    class Short(FakeDrafter):
        max_gamma = 4

        def propose(self, seq, gamma, features=False, sampling=None, slot=0):
            assert gamma <= self.max_gamma, gamma
            return super().propose(seq, gamma, features)

    main_d, other = Short(0.3, 1), FakeDrafter(0.3, 2)
    pair = SimpleNamespace(drafter=main_d, verifier=FakeVerifier(), extra_drafters={"other": other}, runtime=None)
    chosen = [parsing.parse_variant(s, BASE, 1) for s in ("ar", "strict+gamma=4", "strict+gamma=12+drafter=other")]
    prompts = [(f"t{i}", [7, 3, 9, i + 2]) for i in range(2)]
    compare.run_compare(prompts, pair, chosen, tmp_path, progress=False)
    assert main_d.gammas and max(main_d.gammas) <= 4 and 12 in other.gammas


def test_score_runs_each_configurations_outputs_and_pairs_pass_at_1_with_ar(tmp_path, capsys):
    """``vskip compare --summary --score``: outputs become text with the verifier's tokenizer, run
    against the task's tests, and pass@1 is given beside ar's with the prompts where they part."""
    import json

    from transformers import AutoTokenizer

    from vskip.bench import tasks
    from vskip.cli import main
    from vskip.engine.models.verifiers import resolve_verifier_dir

    tok = AutoTokenizer.from_pretrained(resolve_verifier_dir(None), local_files_only=True)
    probs = tasks.load_task("humaneval", ids=["HumanEval/0", "HumanEval/2"])
    good = {p.task_id: tok.encode(p.reference, add_special_tokens=False) for p in probs}  # prompt + canonical body
    bad = tok.encode("def nothing():\n    pass\n", add_special_tokens=False)
    rows = []
    for p in probs:
        for config, out in (("ar", good[p.task_id]), ("strict", good[p.task_id]),
                            ("raw", bad if p.task_id == "HumanEval/0" else good[p.task_id])):
            rows.append({"task_id": p.task_id, "config": config, "repeat": 0, "decode_seconds": 1.0,
                         "generated_tokens": len(out), "digest": compare._digest(out), "tokens": out})
    (tmp_path / "shard-1-of-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "settings.json").write_text(json.dumps({"fixed": {"task": "humaneval", "models": {}}, "configs": {}}))
    assert main(["compare", "--summary", "--score", "--quiet", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert [s["configs"][c]["pass_at_1"] for c in ("ar", "strict", "raw")] == [1.0, 1.0, 0.5]
    assert s["configs"]["raw"]["discordant_vs_ar"] == [0, 1] and s["configs"]["strict"]["discordant_vs_ar"] == [0, 0]
    assert "pass@1" in capsys.readouterr().out
    assert json.loads((tmp_path / "scores.json").read_text())["raw"] == {"HumanEval/0": False, "HumanEval/2": True}
    # a later summary keeps the scores without scoring again; a directory without a task refuses
    assert main(["compare", "--summary", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["configs"]["raw"]["pass_at_1"] == 0.5
    (tmp_path / "settings.json").write_text(json.dumps({"fixed": {}}))
    (tmp_path / "scores.json").unlink()
    assert main(["compare", "--summary", "--score", "--out", str(tmp_path)]) == 2
    assert "names no task" in capsys.readouterr().err


# -- --batch-size: every configuration decodes its prompts side by side -------------------------

class _SlotsVerifier(FakeVerifier):
    """The fake verifier, noting the slots each loop opens and how many calls share each forward."""

    def __init__(self):
        super().__init__()
        self.slots, self.widths = [], []

    def open_slots(self, n):
        self.slots.append(n)

    def score_many(self, calls):
        self.widths.append(len(calls))
        return super().score_many(calls)


def _cli_pair(monkeypatch):
    """`vskip compare` on the fake pair (no model loads); returns the verifier it decodes with."""
    import vskip.engine.door
    from test_sweep import FakeTokenizer

    verifier = _SlotsVerifier()
    pair = SimpleNamespace(drafter=FakeDrafter(0.3, 2), verifier=verifier, tokenizer=FakeTokenizer(), runtime=None,
                           extra_drafters={})
    monkeypatch.setattr(vskip.engine.door, "open_models", lambda *a, **k: pair)
    return verifier


#: what a row of `vskip compare` holds beyond its clocks
_CLOCKS = {"decode_seconds", "draft_seconds", "verify_seconds", "predict_seconds", "shadow_seconds", "machine"}

# Strict SDD drafting every round: a payoff round's choice follows measured clocks, so its calls
# (never its text) may differ from batch 1's (tests/test_payoff.py checks its text batched)
_BATCH_CONFIGS = ("ar,strict+drafts=drafter,raw+eta_b=0.6+eta_c=0.5+k_min=1,"
                  "strict+gamma=4+gamma_max=12+min_match=3+cache=off+drafts=drafter")


def _compare(out, batch: int, *more) -> list:
    from vskip.cli import main

    ids = ",".join(f"HumanEval/{i}" for i in range(5))
    assert main(["compare", "--task", "humaneval", "--ids", ids, "--configs", _BATCH_CONFIGS, "--gamma", "8",
                 "--max-new-tokens", "40", "--repeats", "2", "--quiet", "--out", str(out), "--batch-size", str(batch),
                 *more]) == 0
    rows = [{k: v for k, v in r.to_json().items() if k not in _CLOCKS}
            for r in compare.read_rows(out / "shard-1-of-1.jsonl")]
    return sorted(rows, key=lambda r: (r["task_id"], r["config"], r["repeat"]))


@pytest.mark.parametrize("batch", [2, 3])
def test_a_batched_comparison_gives_the_rows_of_batch_one(tmp_path, monkeypatch, capsys, batch):
    """`vskip compare --batch-size B` on the fake pair: every configuration (ar, Strict SDD, a skip
    policy, the cache off) decodes B prompts side by side and writes, per prompt, configuration and
    repeat, the tokens, counts and rounds batch 1 writes; the batch size is recorded, and a rerun
    at another batch size refuses to mix rows in the directory."""
    verifier = _cli_pair(monkeypatch)
    one = _compare(tmp_path / "one", 1)
    assert set(verifier.slots) == {1} and set(verifier.widths) == {1}
    verifier.slots.clear(), verifier.widths.clear()
    many = _compare(tmp_path / "many", batch)
    assert many == one and len(one) == 5 * 4 * 2
    assert set(verifier.slots) == {batch} and max(verifier.widths) == batch  # side by side, in one forward
    assert "prompts side by side" in capsys.readouterr().out
    for d, b in ((tmp_path / "one", 1), (tmp_path / "many", batch)):
        assert json.loads((d / "settings.json").read_text())["fixed"]["batch_size"] == b
    # resume: nothing is decoded again
    verifier.slots.clear()
    assert _compare(tmp_path / "many", batch) == one and verifier.slots == []
    from vskip.cli import main

    ids = ",".join(f"HumanEval/{i}" for i in range(5))
    assert main(["compare", "--task", "humaneval", "--ids", ids, "--configs", _BATCH_CONFIGS, "--gamma", "8",
                 "--max-new-tokens", "40", "--repeats", "2", "--quiet", "--out", str(tmp_path / "one"),
                 "--batch-size", str(batch)]) == 2
    assert "batch_size" in capsys.readouterr().err


def test_a_batched_comparison_groups_the_prompts_and_rotates_the_order_by_group(tmp_path):
    """Five prompts at batch 2: groups of 2, 2 and 1, each configuration decoding a group in one
    loop, the first configuration moving on from group to group."""
    prompts = [(f"t{i}", [7, 3, 9, i + 2]) for i in range(5)]
    chosen = [parsing.parse_variant(s, BASE, 1) for s in ("ar", "strict", "strict+gamma=4")]
    pair = SimpleNamespace(drafter=FakeDrafter(0.3, 2), verifier=_SlotsVerifier(), runtime=None, extra_drafters={})
    rows = compare.read_rows(compare.run_compare(prompts, pair, chosen, tmp_path, progress=False, batch_size=2))
    assert pair.verifier.slots == [2] * 9  # 3 groups x 3 configurations
    assert [r.config for r in rows[:6]] == ["ar", "ar", "strict", "strict", "strict+gamma=4", "strict+gamma=4"]
    assert [rows[6].config, rows[12].config] == ["strict", "strict+gamma=4"]  # each group's first moves on
    assert [sorted({r.task_id for r in rows[6 * k: 6 * k + 6]}) for k in range(2)] == [["t0", "t1"], ["t2", "t3"]]
    ref = compare.read_rows(compare.run_compare(prompts, _pair(), chosen, tmp_path / "one", progress=False))
    key = lambda r: (r.task_id, r.config)  # noqa: E731
    assert [(key(r), r.tokens, r.accepted) for r in sorted(rows, key=key)] == \
        [(key(r), r.tokens, r.accepted) for r in sorted(ref, key=key)]


def test_transformers_decoders_and_a_bad_batch_size_are_refused(tmp_path, monkeypatch, capsys):
    """hf and lookupN decode one prompt at a time: --batch-size 2 with them refuses before any model
    loads; the parser refuses a batch size outside 1..1024."""
    import vskip.engine.door
    from vskip.cli import main

    monkeypatch.setattr(vskip.engine.door, "open_models", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["compare", "--task", "humaneval", "--ids", "HumanEval/0", "--configs", "ar,strict,hf,lookup4",
                 "--batch-size", "2", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "--batch-size 2: hf, lookup4 decode one prompt at a time" in err
    assert not list((tmp_path / "c").iterdir())  # no settings recorded, no rows
    with pytest.raises(ValueError, match="one prompt at a time"):
        compare.run_compare([("t0", [7, 3])], _pair(), [parsing.parse_variant("hf", BASE, 1)], tmp_path, batch_size=2)
    for bad in ("0", "1025", "two"):
        with pytest.raises(SystemExit) as e:
            main(["compare", "--task", "humaneval", "--batch-size", bad])
        assert e.value.code == 2
        assert "argument --batch-size" in capsys.readouterr().err
