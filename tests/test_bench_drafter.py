"""benchmarks/bench_drafter.py records the settings of the runs it summarises, not its own
argument defaults."""

import json
from pathlib import Path

from scripts import load_script


def _run(d: Path, policy: str, gamma: int, L: list[int], copy_prior: str = "auto"):
    d.mkdir()
    run = {"task": "humaneval", "limit": 3, "ids": None, "policy": {"name": policy},
           "decode": {"gamma": gamma, "max_new_tokens": 512}, "models": {"drafter": None, "copy_prior": copy_prior}}
    (d / "config.json").write_text(json.dumps({"run": run}))
    n = sum(L) + len(L)
    blocks = len(L) if policy != "ar" else 0
    (d / "summary.json").write_text(json.dumps({
        "generated_tokens": n, "decode_seconds": 2.0, "verifier_calls": len(L), "draft_blocks": blocks,
        "draft_seconds": 0.5, "verify_seconds": 1.0, "n_prompts": 3, "tokens_per_s": n / 2.0,
        "c_D": 0.5 / blocks if blocks else None, "c_V": 1.0 / len(L)}))
    (d / "rounds.jsonl").write_text("".join(json.dumps({"task_id": "HumanEval/0", "L": x, "gamma": gamma}) + "\n" for x in L))


def test_settings_come_from_the_runs(tmp_path):
    mod = load_script("bench_drafter")
    _run(tmp_path / "ar", "ar", 1, [0] * 10)
    _run(tmp_path / "strict", "strict", 8, [1, 2, 3, 0, 8])
    out = tmp_path / "out"
    assert mod.main(["--runs", str(tmp_path / "ar"), str(tmp_path / "strict"), "--out", str(out)]) == 0
    data = json.loads((out / "results.json").read_text())
    runs = data["settings"]["runs"]
    assert runs[str(tmp_path / "strict")]["decode"]["max_new_tokens"] == 512  # not the default 256
    assert runs[str(tmp_path / "ar")]["limit"] == 3 and "limit" not in data["settings"]
    assert data["results"]["ar"]["c_V_ms"] == 100.0  # 1 s over 10 calls: ar's c_V is recorded too
    assert data["results"]["gamma=8"]["mean_L"] == 14 / 5


def test_the_network_alone_beside_the_default_without_ar(tmp_path):
    """Runs with the copy prior off are their own rows; without an `ar` run there is no speed ratio."""
    mod = load_script("bench_drafter")
    _run(tmp_path / "net", "strict", 8, [0, 1, 0, 2], copy_prior="off")
    _run(tmp_path / "default", "strict", 8, [1, 2, 3, 0, 8])
    out = tmp_path / "out"
    assert mod.main(["--runs", str(tmp_path / "net"), str(tmp_path / "default"), "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())["results"]
    assert res["gamma=8 network"]["mean_L"] == 3 / 4 and res["gamma=8"]["mean_L"] == 14 / 5
    assert res["gamma=8"]["speedup_vs_ar"] is None and res["gamma=8 network"]["p_L_ge"][0] == 2 / 4


def test_outputs_are_checked_against_a_longer_ar_reference(tmp_path):
    """--reference: a run at 4 new tokens equals the first 4 tokens of ar's longer answers, or not."""
    mod = load_script("bench_drafter")
    _run(tmp_path / "strict", "strict", 8, [1, 2, 3])
    cfg = json.loads((tmp_path / "strict" / "config.json").read_text())
    cfg["run"]["decode"]["max_new_tokens"] = 4
    (tmp_path / "strict" / "config.json").write_text(json.dumps(cfg))
    mine = {"A": [1, 2, 3, 4], "B": [5, 6], "C": [7, 8, 9, 9]}
    (tmp_path / "strict" / "samples.jsonl").write_text("".join(json.dumps({"task_id": t, "tokens": v}) + "\n"
                                                               for t, v in mine.items()))
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    ar = {"A": [1, 2, 3, 4, 5, 6], "B": [5, 6], "C": [7, 8, 9, 0, 1]}  # C differs at its fourth token
    rows = [{"task_id": t, "config": "ar", "output": v} for t, v in ar.items()]
    rows.append({"task_id": "A", "config": "strict", "output": [0]})  # other configurations are not the reference
    (cmp / "shard-1-of-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert mod.main(["--runs", str(tmp_path / "strict"), "--reference", str(cmp), "--out", str(out)]) == 0
    same = json.loads((out / "results.json").read_text())["same_as_ar"][str(tmp_path / "strict")]
    assert same == {"same_as_ar": 2, "n_prompts": 3}
    assert "2/3 outputs equal to ar" in (out / "results.md").read_text()


def test_common_pairs_the_runs_on_their_shared_prompts(tmp_path):
    """--common: totals and rounds only over the prompts every run finished; a float32 drafter is its own row."""
    mod = load_script("bench_drafter")
    for name, n, dtype in (("full", 3, "auto"), ("part", 1, "float32")):
        d = tmp_path / name
        _run(d, "strict", 8, [2] * n)
        cfg = json.loads((d / "config.json").read_text())
        cfg["run"]["models"]["drafter_dtype"] = dtype
        (d / "config.json").write_text(json.dumps(cfg))
        ids = ["A", "B", "C"][:n]
        (d / "rounds.jsonl").write_text("".join(json.dumps({"task_id": t, "L": 2 if name == "part" else k, "gamma": 8}) + "\n"
                                                for k, t in enumerate(ids)))
        (d / "samples.jsonl").write_text("".join(json.dumps({
            "task_id": t, "generated_tokens": 3 * (k + 1), "decode_seconds": 1.0, "verifier_calls": 1, "draft_blocks": 1,
            "draft_seconds": 0.1, "verify_seconds": 0.5}) + "\n" for k, t in enumerate(ids)))
    out = tmp_path / "out"
    assert mod.main(["--runs", str(tmp_path / "full"), str(tmp_path / "part"), "--common", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())["results"]
    assert res["gamma=8"]["tokens"] == 3 and res["gamma=8"]["mean_L"] == 0  # prompt A alone
    assert res["gamma=8 float32 drafter"]["tokens"] == 3 and res["gamma=8 float32 drafter"]["mean_L"] == 2
    assert mod.main(["--runs", str(tmp_path / "full"), str(tmp_path / "part"), "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text())["results"]["gamma=8"]["tokens"] == 9  # summary.json: 3 rounds of L = 2


def _samples(d: Path, rows):
    d.mkdir()
    (d / "samples.jsonl").write_text("".join(json.dumps({"task_id": t, "generated_tokens": n, "verifier_calls": c}) + "\n"
                                             for t, n, c in rows))


def test_paired_drafters_compare_calls_on_shared_prompts(tmp_path):
    """The ratio of tokens per call is taken on the prompts both runs finished, its interval
    covers it, and runs that committed different tokens (not both lossless) are refused."""
    import pytest

    mod = load_script("paired_drafters")
    _samples(tmp_path / "a", [("t0", 64, 32), ("t1", 64, 16), ("t2", 64, 20)])
    _samples(tmp_path / "b", [("t0", 64, 16), ("t1", 64, 16), ("t9", 64, 1)])
    r = mod.paired_ratio(mod.per_prompt(tmp_path / "a"), mod.per_prompt(tmp_path / "b"), resamples=500)
    assert r["prompts"] == 2 and r["ratio"] == pytest.approx(48 / 32)
    assert r["ci95"][0] <= r["ratio"] <= r["ci95"][1] and (r["prompts_b_fewer_calls"], r["prompts_b_more_calls"]) == (1, 0)
    _samples(tmp_path / "c", [("t0", 60, 16)])
    with pytest.raises(SystemExit, match="different token counts"):
        mod.paired_ratio(mod.per_prompt(tmp_path / "a"), mod.per_prompt(tmp_path / "c"))
    with pytest.raises(SystemExit, match="not a finished"):
        mod.per_prompt(tmp_path / "missing")
