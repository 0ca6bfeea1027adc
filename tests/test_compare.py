"""`vskip compare`: configuration specs, paired rows with resume, and the summary against ar."""

import json
from types import SimpleNamespace

import pytest

from fakes import FakeDrafter, FakeVerifier
from vskip import compare
from vskip.decode import DecodeConfig

BASE = DecodeConfig(gamma=8, max_new_tokens=40)


def test_parse_variant():
    v = compare.parse_variant("strict", BASE, 1)
    assert (v.policy, v.decode.gamma, v.decode.gamma_max, v.steps) == ("strict", 8, None, 1)
    v = compare.parse_variant("strict+gamma=4+gamma_max=16+min_match=6+trim=0.5+steps=2", BASE, 1)
    assert (v.decode.gamma, v.decode.gamma_max, v.decode.min_match, v.decode.trim, v.steps) == (4, 16, 6, 0.5, 2)
    v = compare.parse_variant("raw+gamma=12", BASE, 1)
    assert (v.policy, v.decode.gamma, v.decode.gamma_max) == ("raw", 12, None)
    assert compare.parse_variant("lookup10", BASE, 1).lookup == 10
    assert compare.parse_variant("hf", BASE, 1).hf
    fast = compare.parse_variant("fast", BASE, 1)
    assert fast.name == "fast" and fast.decode == compare.parse_variant(compare.FAST, BASE, 1).decode
    for bad in ("nope", "strict+", "lookup0", "lookupx", "strict+gamma", "strict+gamma=x", "strict+foo=1",
                "strict+steps=0", "strict+gamma=0", "strict+trim=2"):
        with pytest.raises(ValueError):
            compare.parse_variant(bad, BASE, 1)
    with pytest.raises(ValueError, match="does not load trained predictors"):
        compare.parse_variant("marginal", BASE, 1)


def _pair():
    return SimpleNamespace(drafter=FakeDrafter(0.3, 2), verifier=FakeVerifier())


def test_rows_pair_every_prompt_and_resume(tmp_path):
    prompts = [(f"t{i}", [7, 3, 9, i + 2]) for i in range(5)]
    variants = [compare.parse_variant(s, BASE, 1) for s in ("ar", "strict", "strict+gamma=4+gamma_max=12+min_match=3+trim=0.6")]
    path = compare.run_compare(prompts, _pair(), variants, tmp_path, progress=False)
    rows = compare.read_rows(path)
    assert sorted((r["task_id"], r["config"]) for r in rows) == sorted(
        (t, v.name) for t, _ in prompts for v in variants)
    # the order of configurations rotates from prompt to prompt
    firsts = [rows[3 * k]["config"] for k in range(3)]
    assert firsts == ["ar", "strict", "strict+gamma=4+gamma_max=12+min_match=3+trim=0.6"]
    # a cut line and a missing row are redone, nothing is counted twice
    text = path.read_text().splitlines()
    path.write_text("\n".join(text[:-2]) + "\n" + text[-2][: len(text[-2]) // 2])
    compare.run_compare(prompts, _pair(), variants, tmp_path, progress=False)
    rows = compare.read_rows(path)
    assert len({(r["task_id"], r["config"]) for r in rows}) == len(rows) == 15
    s = compare.summarize_comparison(rows)
    import gzip

    (tmp_path / "archived").mkdir()
    (tmp_path / "archived" / (path.name + ".gz")).write_bytes(gzip.compress(path.read_bytes()))
    assert compare.summarize_comparison(compare.rows_of(tmp_path / "archived")) == s
    assert s["n_prompts"] == 5
    # Strict SDD is lossless with either block length rule
    assert s["configs"]["strict"]["same_as_ar"] == s["configs"]["strict+gamma=4+gamma_max=12+min_match=3+trim=0.6"]["same_as_ar"] == 5
    assert s["configs"]["ar"]["ratio_vs_ar"] == pytest.approx(1.0)
    assert s["configs"]["strict"]["tokens_per_call"] > 1
    acc = [x for r in rows if r["config"] == "strict" for x in r["accepted"]]
    assert s["configs"]["strict"]["p_L_ge1"] == pytest.approx(sum(x >= 1 for x in acc) / len(acc))
    assert "× ar" in compare.format_summary(s)


def test_summary_reports_where_outputs_diverge():
    rows = [
        {"task_id": "a", "config": "ar", "tokens": 4, "seconds": 1.0, "output": [1, 2, 3, 4]},
        {"task_id": "b", "config": "ar", "tokens": 3, "seconds": 1.0, "output": [5, 6, 7]},
        {"task_id": "a", "config": "x", "tokens": 4, "seconds": 0.5, "output": [1, 2, 9, 4]},
        {"task_id": "b", "config": "x", "tokens": 3, "seconds": 0.5, "output": [5, 6, 7]},
    ]
    for r in rows:
        r["digest"] = compare._digest(r["output"])
    s = compare.summarize_comparison(rows)["configs"]["x"]
    assert s["same_as_ar"] == 1 and s["first_divergence"] == {"n": 1, "median": 2.0, "min": 2}
    assert s["ratio_vs_ar"] == pytest.approx(2.0)
    with pytest.raises(ValueError):
        compare.summarize_comparison([r for r in rows if r["config"] == "x"])


def test_an_out_directory_refuses_rows_made_otherwise(tmp_path):
    from vskip.runner import ModelConfig
    from vskip.runtime import Runtime

    def record(max_new=40, gamma=8, configs=("ar", "strict")):
        dec = DecodeConfig(gamma=gamma, max_new_tokens=max_new)
        vs = [compare.parse_variant(s, dec, 1) for s in configs]
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
