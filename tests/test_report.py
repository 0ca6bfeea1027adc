"""Reports from synthetic run directories: the numbers, the frontiers, the tables, and what happens
with runs from another version, unfinished runs, no reference or unreadable files."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vskip import report
from vskip.cli import main
from vskip.engine.policy import break_even_length

IDS = ["HumanEval/0", "HumanEval/1", "HumanEval/2", "HumanEval/3"]


def write_run(d: Path, policy: str, *, calls, blocks, seconds, passed, tokens=10, commit=2.0, task="humaneval",
              gamma=16, params=None, ids=IDS, relaxed=(), summary=True, config=True, drop_sample=(), drop_round=(),
              draft_share=0.25, verify_share=0.6, predictor=None):
    """A run directory as vskip writes it: per prompt ``tokens`` generated, ``calls`` verifier
    calls, ``blocks`` draft blocks, ``seconds`` of decoding, and rounds whose strict rounds each
    commit ``commit`` tokens; ``relaxed``: (K, L) of skipped rounds added to every prompt."""
    d.mkdir(parents=True)
    params = params or {}
    pol = {"name": policy, "eta_b": 0.9, "eta_c": 0.93, "k_min": 6, "s_max": 64, "lenience": 1.0, "top_k": 1,
           "period": 4, "period_k": 6, **params}
    samples, rounds = [], []
    for i, tid in enumerate(ids):
        s = {"task_id": tid, "completion": "x", "passed": passed[i], "generated_tokens": tokens,
             "decode_seconds": seconds, "verifier_calls": calls, "draft_blocks": blocks,
             "skipped_rounds": len(relaxed), "draft_seconds": draft_share * seconds,
             "verify_seconds": verify_share * seconds, "predict_seconds": 0.0, "shadow_seconds": 0.0}
        for k in drop_sample:
            s.pop(k, None)
        samples.append(s)
        for j in range(calls):
            rounds.append({"task_id": tid, "round": j, "verified": True, "K": 0, "K_hat": 0, "L": int(commit) - 1,
                           "accepted": int(commit) - 1, "committed": commit, "relaxed": False, "reason": "verify",
                           "gamma": gamma})
        for K, L in relaxed:
            rounds.append({"task_id": tid, "round": 99, "verified": False, "K": K, "K_hat": K, "L": L, "accepted": K,
                           "committed": K, "relaxed": True, "reason": "skip", "gamma": gamma})
    for r in rounds:
        for k in drop_round:
            r.pop(k, None)
    (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))
    if config:
        run = {"task": task, "policy": pol, "decode": {"gamma": gamma, "max_new_tokens": 512, "shadow": True},
               "models": {"steps": 2, "verifier_cache": True}, "limit": None, "ids": list(IDS), "score": True,
               "predictor": predictor}
        command = f"vskip run --task {task} --policy {policy} --gamma {gamma} --out {d.name}"
        (d / "config.json").write_text(json.dumps({"run": run, "models": {"verifier": "v"}, "command": command}))
    if summary:
        keep = {k: pol[k] for k in ("eta_b", "eta_c", "k_min", "s_max")} if policy in ("raw", "marginal", "conditional") else {}
        (d / "summary.json").write_text(json.dumps({"task": task, "policy": policy, **keep, "gamma": gamma,
                                                    "n_prompts": len(samples)}))
    return d


@pytest.fixture
def sweep_dir(tmp_path):
    """Strict SDD and a small grid of every kind, with numbers chosen by hand."""
    root = tmp_path / "sweep"
    T = [True, True, False, True]  # strict: 3/4
    write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=T)
    # raw A: fewer calls, same pass@1, faster
    write_run(root / "raw_a", "raw", calls=4, blocks=6, seconds=0.8, passed=T, relaxed=[(6, 6), (6, 3)],
              params={"eta_b": 0.90, "eta_c": 0.93})
    # raw B: even fewer calls but lower pass@1
    write_run(root / "raw_b", "raw", calls=3, blocks=6, seconds=0.9, passed=[True, False, False, True],
              relaxed=[(8, 2)], params={"eta_b": 0.70, "eta_c": 0.70})
    # raw C: dominated by A in (rel calls, pass@1): more calls, same pass@1
    write_run(root / "raw_c", "raw", calls=5, blocks=6, seconds=1.1, passed=T, params={"eta_b": 0.95, "eta_c": 0.99})
    # the k_min diagnostic around raw A's thresholds
    write_run(root / "raw_k0", "raw", calls=3, blocks=9, seconds=1.2, passed=T, params={"k_min": 0})
    write_run(root / "raw_k3", "raw", calls=4, blocks=7, seconds=0.85, passed=T, params={"k_min": 3})
    # gate ablation variants of raw A
    write_run(root / "raw_local", "raw", calls=4, blocks=6, seconds=0.8, passed=T, params={"eta_c": 0.0})
    write_run(root / "raw_geo", "raw", calls=3, blocks=6, seconds=0.7, passed=[True, False, False, False],
              params={"eta_b": 0.0})
    write_run(root / "lenience_05", "lenience", calls=4, blocks=4, seconds=0.9, passed=[True, True, True, True],
              params={"lenience": 0.5}, relaxed=[])
    write_run(root / "periodic_4", "periodic", calls=5, blocks=6, seconds=1.0, passed=[True, True, False, False],
              params={"period": 4})
    return root


def rows_by_name(rep):
    return {r.name: r for rows in rep.rows.values() for r in rows}


def build(paths, out, **kw):
    msgs = []
    rep = report.build_report(paths, out, n_boot=500, warn=msgs.append, **kw)
    return rep, msgs


# --------------------------------------------------------------------------- numbers


def test_relative_metrics(sweep_dir, tmp_path):
    rep, msgs = build([sweep_dir], tmp_path / "out")
    assert msgs == [] and rep.notes == []
    r = rows_by_name(rep)
    a = r["raw_a"]
    assert a.ref.label == "strict" and a.common == 4
    assert a.rel_calls == pytest.approx(4 / 5)  # (16/40) / (20/40)
    assert a.rel_blocks == pytest.approx(6 / 5)
    assert a.m.tokens_per_s == pytest.approx(40 / 3.2)
    assert a.speedup == pytest.approx((40 / 3.2) / (40 / 4.0))
    assert a.m.pass_at_1 == 0.75 and a.delta == 0.0
    # StrictToken = sum min(K, L) / sum K = (6 + 3) / 12; FullPrefix = 1/2 (per prompt, pooled)
    assert a.m.strict_token == pytest.approx(9 / 12)
    assert a.m.full_prefix == pytest.approx(0.5)
    assert r["strict"].rel_calls == 1.0 and r["strict"].m.strict_token == 1.0
    b = r["raw_b"]
    assert b.delta == pytest.approx(-0.25) and b.ci[0] <= -0.25 <= b.ci[1]
    assert b.m.strict_token == pytest.approx(2 / 8) and b.m.full_prefix == 0.0


def test_break_even_length(sweep_dir, tmp_path):
    rep, _ = build([sweep_dir], tmp_path / "out")
    a = rows_by_name(rep)["raw_a"]
    # c_D = 0.25 * 0.8 s / 6 blocks, c_V = 0.6 * 0.8 s / 4 calls, A = 2 tokens per strict round
    c_D, c_V = 0.2 / 6, 0.48 / 4
    assert a.m.c_D == pytest.approx(c_D) and a.m.c_V == pytest.approx(c_V) and a.A == 2.0
    assert a.K_star == pytest.approx(2.0 * c_D / (c_D + c_V)) == pytest.approx(break_even_length(2.0, c_D, c_V))


def test_kmin_family_and_eq8_agreement(sweep_dir, tmp_path):
    rep, _ = build([sweep_dir], tmp_path / "out")
    rows = next(iter(rep.rows.values()))
    fams = report.kmin_families(rows)
    assert len(fams) == 1
    f = fams[0]
    assert [r.p("k_min") for r in f.rows] == [0, 3, 6]
    # strict: c_D = 0.25/5, c_V = 0.6/5, A = 2 -> K* = 2 * 0.25 / 0.85 = 0.588 < 1: every skip (at least
    # one token, so k_min 0 acts as 1) pays, and the prediction is the smallest k_min of the grid
    assert f.K_star == pytest.approx(2 * 0.25 / 0.85)
    assert f.predicted == 0
    assert f.best == 6  # raw_a is the fastest (40 / 3.2 tokens/s)
    assert f.agrees is False and f.above is True
    # Eq. 7 at Strict SDD's costs (c_D 0.05 s, c_V 0.12 s): 9 blocks and 3 calls (0.81 s), 7 and 4 (0.83 s),
    # 6 and 4 (0.78 s): k_min 6 again, from the counts alone
    assert f.best_eq7 == 6 and f.agrees_eq7 is False
    csv_text = (tmp_path / "out" / "kmin_humaneval_g16.csv").read_text()
    assert "raw_k0" in csv_text and "raw_k3" in csv_text
    assert (tmp_path / "out" / "fig5_humaneval_g16_0.png").stat().st_size > 1000


def test_pareto_front():
    assert report.pareto_front([1, 2, 3, 2], [3, 2, 1, 1]) == [True, True, True, False]
    # fewer calls better, higher pass@1 better
    assert report.pareto_front([0.8, 0.9, 0.85], [0.9, 0.95, 0.85], x_max=False) == [True, True, False]
    # equal points do not dominate each other
    assert report.pareto_front([1, 1], [1, 1]) == [True, True]


def test_frontiers_fade_dominated_settings(sweep_dir, tmp_path):
    rep, _ = build([sweep_dir], tmp_path / "out")
    rows = next(iter(rep.rows.values()))
    fr = report.frontiers(rows, lambda r: r.rel_calls, lambda r: r.pass_common, False, True, k_min=6)
    raw = {r.name: on for r, on in fr["raw"]}
    # the k_min diagnostic and the gate ablation are not part of the raw frontier
    assert set(raw) == {"raw_a", "raw_b", "raw_c"}
    assert raw == {"raw_a": True, "raw_b": True, "raw_c": False}
    assert {r.name for r, _ in fr["lenience"]} == {"lenience_05"}
    for fig in ("fig1_humaneval_g16.png", "fig4_humaneval_g16.png"):
        assert (tmp_path / "out" / fig).stat().st_size > 1000


def test_tables(sweep_dir, tmp_path):
    out = tmp_path / "out"
    # another full setting with the same eta_b: raw_local is not its variant
    write_run(sweep_dir / "raw_d", "raw", calls=5, blocks=6, seconds=1.1, passed=[True] * 4,
              params={"eta_b": 0.90, "eta_c": 0.99})
    rep, _ = build([sweep_dir], out)
    md = (out / "report.md").read_text()
    # Table 2: full, local only, geometric only
    t2 = (out / "table2_humaneval_g16.md").read_text()
    assert "| Full | raw_a |" in t2 and "| Local only | raw_local |" in t2 and "| Geometric only | raw_geo |" in t2
    assert "raw_d" not in t2 and t2.count("raw_local") == 1
    # Table 3: periodic P=4 (rel calls 1.0, pass@1 0.5) is dominated by raw_a (0.8, 0.75) and by
    # raw_b (0.6, 0.5); the one with the fewest calls is named
    t3 = (out / "table3_humaneval_g16.csv").read_text().splitlines()
    assert t3[1] == "4,periodic_4,0.5,10.0,1.0,1.0,raw_b"
    # Matched quality: raw points with pass@1 equal to strict's: raw_a (0.8 calls) beats raw_c (1.0)
    matched = (out / "matched_humaneval_g16.csv").read_text().splitlines()
    row = next(l for l in matched if l.startswith("Raw confidence,=,fewest calls"))
    cells = row.split(",")
    assert cells[3] == "raw_a" and float(cells[5]) == pytest.approx(0.8) and float(cells[6]) == pytest.approx(0.2)
    assert any(l.startswith("Lenience,=,none observed") for l in matched)
    assert any(l.startswith("Lenience,≥,fewest calls,lenience_05") for l in matched)
    # Table 4: strict and raw at its fixed setting
    t4 = (out / "table4.csv").read_text()
    assert "Strict SDD" in t4 and "raw_a" in t4 and "raw_c" not in t4
    # every table and figure is in report.md, and the commands are listed
    for f in rep.files:
        if f.endswith(".png") or f.endswith(".md") and f != "report.md":
            assert f in md, f
    assert "vskip run --task humaneval --policy raw --gamma 16 --out raw_a" in md  # as recorded, not rebuilt


def test_a_sweep_unit_shows_its_sweep_command_and_an_unrecorded_run_says_so(tmp_path):
    from vskip.study.rundir import load_run

    unit = write_run(tmp_path / "s" / "raw_a", "raw", calls=4, blocks=6, seconds=0.8, passed=[True] * 4, config=False)
    (tmp_path / "s" / "sweep.json").write_text(json.dumps({"command": "vskip sweep --grid cpu-small --out s"}))
    assert load_run(unit).command() == "vskip sweep --grid cpu-small --out s  # configuration raw_a"
    alone = write_run(tmp_path / "alone", "raw", calls=4, blocks=6, seconds=0.8, passed=[True] * 4, config=False)
    assert load_run(alone).command() == "(not recorded)"


# --------------------------------------------------------------------------- robustness


def test_runs_lacking_fields_say_what_is_unknown(tmp_path):
    root = tmp_path / "old"
    write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True] * 4, config=False,
              drop_sample=("draft_seconds", "verify_seconds"))
    write_run(root / "raw", "raw", calls=4, blocks=6, seconds=0.8, passed=[True] * 4, config=False,
              relaxed=[(6, 3)], drop_sample=("draft_seconds", "verify_seconds"),
              drop_round=("relaxed", "accepted", "gamma", "K_hat", "reason"))
    rep, msgs = build([root], tmp_path / "out")
    r = rows_by_name(rep)["raw"]
    assert r.rel_calls == pytest.approx(0.8)
    assert r.m.strict_token is None  # rounds without relaxed/accepted cannot tell agreement
    assert r.m.c_D is None and r.K_star is None
    text = "\n".join(msgs)
    assert "no config.json" in text and "draft_seconds" in text and "relaxed/accepted" in text
    assert "no config.json" in (tmp_path / "out" / "report.md").read_text()


def test_unfinished_run_is_compared_on_common_prompts(tmp_path):
    root = tmp_path / "s"
    write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True, True, False, True])
    write_run(root / "raw", "raw", calls=4, blocks=6, seconds=0.8, passed=[True, False], ids=IDS[:2], summary=False)
    (root / "raw" / "samples.jsonl").open("a").write('{"task_id": "HumanEval/2", "compl')  # cut by a kill
    rep, msgs = build([root], tmp_path / "out")
    r = rows_by_name(rep)["raw (partial: 2 of 4)"]
    assert r.m.n == 2 and r.common == 2 and r.partial == (2, 4)
    assert r.pass_common == 0.5 and r.ref_pass_common == 1.0 and r.delta == -0.5
    text = "\n".join(msgs)
    assert "unfinished" in text and "2 of 4" in text and "cut or invalid" in text and "on the 2 prompts" in text


def _figure_section(report_md: str, caption: str) -> str:
    start = report_md.index(f"### {caption}")
    return report_md[start : report_md.index("\n### ", start + 4)]


@pytest.mark.parametrize("include", [False, True])
def test_a_partial_run_is_marked_in_tables_and_left_out_of_figures(tmp_path, include):
    """A run of one prompt beside runs of four: its label says so in every table, and the figures
    and frontiers leave it out unless --include-partial."""
    root = tmp_path / "s"
    T = [True, True, False, True]
    write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=T)
    write_run(root / "raw_full", "raw", calls=4, blocks=6, seconds=0.8, passed=T, relaxed=[(6, 6)])
    write_run(root / "raw_one", "raw", calls=2, blocks=6, seconds=0.2, passed=[True], ids=IDS[:1], relaxed=[(6, 6)],
              params={"eta_b": 0.5, "eta_c": 0.5})
    out = tmp_path / "out"
    rep, msgs = build([root], out, include_partial=include)
    assert rows_by_name(rep)["raw_one (partial: 1 of 4)"].partial == (1, 4)
    assert rows_by_name(rep)["raw_full"].partial is None
    assert "raw_one (partial: 1 of 4)" in (out / "runs_humaneval_g16.md").read_text()
    assert any("raw_one: partial (1 of 4 prompts)" in m for m in msgs)
    fig1 = _figure_section((out / "report.md").read_text(), "Strict token agreement vs tokens/s (Figure 1)")
    assert "raw_full" in fig1
    assert ("raw_one" in fig1) == include


def test_runs_of_several_completions_per_prompt_pair_completion_by_completion(tmp_path):
    """--samples-per-prompt runs: each completion counts as a prompt of its own (TASK#SAMPLE), so
    ar and Strict SDD sampled with the same seed pair completion by completion; sample 0 keeps the
    task's id; the run is complete when it holds every completion its config asked for."""
    root = tmp_path / "s"
    for name, policy, calls in (("ar", "ar", 10), ("strict", "strict", 5)):
        d = write_run(root / name, policy, calls=calls, blocks=calls, seconds=1.0, passed=[True, False, False, True])
        for f in ("samples.jsonl", "rounds.jsonl"):
            rows = [json.loads(x) for x in (d / f).read_text().splitlines()]
            twice = [dict(r, sample=k) for k in (0, 1) for r in rows]
            (d / f).write_text("".join(json.dumps(r) + "\n" for r in twice))
        cfg = json.loads((d / "config.json").read_text())
        cfg["run"]["samples_per_prompt"] = 2
        (d / "config.json").write_text(json.dumps(cfg))
    rep, msgs = build([root], tmp_path / "out")
    r = rows_by_name(rep)["ar"]
    assert r.m.n == 8 and r.common == 8 and r.partial is None
    assert "HumanEval/0" in r.run.ids and "HumanEval/0#1" in r.run.ids
    assert r.rel_calls == pytest.approx(2.0) and r.m.pass_at_1 == 0.5
    assert not any("unfinished" in m for m in msgs)


def test_no_strict_reference(tmp_path):
    root = tmp_path / "s"
    write_run(root / "raw", "raw", calls=4, blocks=6, seconds=0.8, passed=[True] * 4, relaxed=[(6, 6)])
    rep, msgs = build([root], tmp_path / "out")
    r = rows_by_name(rep)["raw"]
    assert r.rel_calls is None and r.delta is None and r.m.tokens_per_s == pytest.approx(12.5)
    assert any("no Strict SDD run" in m for m in msgs)
    out = tmp_path / "out"
    assert (out / "runs_humaneval_g16.csv").exists() and (out / "fig1_humaneval_g16.png").exists()
    assert not (out / "fig4_humaneval_g16.png").exists()  # nothing to draw without relative calls
    assert "No Strict SDD run" in (out / "report.md").read_text()


def test_unreadable_and_missing_inputs(tmp_path):
    root = tmp_path / "s"
    write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True] * 4)
    bad = root / "broken"
    bad.mkdir()
    (bad / "summary.json").write_text("{not json")
    (bad / "config.json").write_text("[1, 2]")
    odd = write_run(root / "odd", "raw", calls=4, blocks=6, seconds=0.8, passed=[True] * 4)
    lines = (odd / "samples.jsonl").read_text().splitlines()
    lines[0] = lines[0].replace('"generated_tokens": 10', '"generated_tokens": "ten"')
    (odd / "samples.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "empty").mkdir()
    rep, msgs = build([root, tmp_path / "empty", tmp_path / "nowhere"], tmp_path / "out")
    text = "\n".join(msgs)
    assert "summary.json is unreadable" in text and "not a JSON object" in text
    assert "holds no run directories" in text and "does not exist" in text
    assert "odd: metrics: could not be produced" in text
    assert (tmp_path / "out" / "report.md").exists()
    with pytest.raises(ValueError, match="no run directories"):
        report.build_report([tmp_path / "empty"], tmp_path / "out2", warn=lambda m: None)


def test_shard_directories_are_not_runs(sweep_dir, tmp_path):
    write_run(sweep_dir / "_shards" / "raw_x" / "000", "raw", calls=1, blocks=1, seconds=1.0, passed=[True] * 4)
    rep, _ = build([sweep_dir], tmp_path / "out")
    assert "000" not in rows_by_name(rep)


def test_cli(sweep_dir, tmp_path):
    (sweep_dir / "raw_a" / "summary.json").unlink()
    code = "import sys; from vskip.cli import main; sys.exit(main(sys.argv[1:]))\n"
    res = subprocess.run([sys.executable, "-c", code, "report", str(sweep_dir), "--out", str(tmp_path / "o"),
                          "--bootstrap", "200"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "raw_a: unfinished" in res.stderr
    assert json.loads(res.stdout)["report"].endswith("report.md")
    res = subprocess.run([sys.executable, "-c", code, "report", str(tmp_path / "nothing"), "--out",
                          str(tmp_path / "o2")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("vskip: error: no run directories")
    res = subprocess.run([sys.executable, "-c", code, "report", "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--out" in res.stdout


def test_a_report_rebuilds_byte_for_byte(sweep_dir, tmp_path, monkeypatch):
    """The report is a function of its inputs alone: rebuilt by the same command from a copy of
    the same run directories made elsewhere, every Markdown and CSV file is identical. So a
    committed report can always be checked by regenerating it with its recorded command."""
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.chdir(sweep_dir.parent)
    build([Path("sweep")], a)
    other = tmp_path / "elsewhere" / "sweep"
    shutil.copytree(sweep_dir, other)
    monkeypatch.chdir(other.parent)
    build([Path("sweep")], b)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.suffix in (".md", ".csv"))
    assert files and files == sorted(p.relative_to(b) for p in b.rglob("*") if p.suffix in (".md", ".csv"))
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_intervals_and_the_second_quality_axis(sweep_dir, tmp_path):
    """Paired bootstrap intervals hold their point values; identical pass/fail outcomes give 0
    discordant prompts and an exact bound on |Δpass@1| (not [0, 0]); `= ar` counts outputs equal
    to ar's token for token."""
    import numpy as np

    from vskip.report.paired import clopper_pearson_upper

    ar = write_run(sweep_dir / "ar", "ar", calls=10, blocks=0, seconds=2.0, passed=[True, True, False, True])
    for d, toks in ((ar, [[1, 2]] * 4), (sweep_dir / "strict", [[1, 2], [1, 2], [1, 2], [9]]),
                    (sweep_dir / "raw_a", [[1, 2], [1, 3], [1, 2], [9]])):
        lines = [json.loads(x) for x in (d / "samples.jsonl").read_text().splitlines()]
        for s, t in zip(lines, toks):
            s["tokens"] = t
        (d / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in lines))
    rep, _ = build([sweep_dir], tmp_path / "out")
    rows = rows_by_name(rep)
    a = rows["raw_a"]
    iv = a.intervals
    assert iv["prompts"] == 4 and iv["discordant"] == 0
    assert iv["delta_pass_bound"] == pytest.approx(1 - 0.05 ** (1 / 4))  # nothing discordant among 4
    assert iv["delta_pass_bound"] == pytest.approx(clopper_pearson_upper(0, 4))
    assert iv["rel_calls"][0] <= a.rel_calls <= iv["rel_calls"][1]
    assert iv["strict_token"][0] <= a.m.strict_token <= iv["strict_token"][1]
    assert a.equal_ar == (2, 4)
    assert a.equal_strict == (3, 4) and rows["strict"].equal_strict == (4, 4)  # against Strict SDD's tokens
    assert rows["strict"].intervals["strict_token"] == (1.0, 1.0)
    text = (tmp_path / "out" / "intervals_humaneval_g16.md").read_text()
    assert "raw_a" in text and "2/4" in text
    b = rows["raw_b"].intervals  # 1 of 4 outcomes differs from Strict SDD
    assert b["discordant"] == 1 and b["delta_pass_bound"] == pytest.approx(clopper_pearson_upper(1, 4))
    assert 0.75 < b["delta_pass_bound"] < 0.76  # scipy: beta.ppf(0.95, 2, 3)
    assert np.isclose(clopper_pearson_upper(4, 4), 1.0)


def test_the_archive_rebuilds_the_report(sweep_dir, tmp_path, monkeypatch):
    """--archive keeps the run files behind a report in one deterministic file; extracted
    elsewhere, they give the same report byte for byte."""
    import tarfile

    from vskip.report.build import archive_runs

    monkeypatch.chdir(sweep_dir.parent)
    rep, _ = build([Path("sweep")], tmp_path / "a")
    first = archive_runs(rep, tmp_path / "a" / "runs.tar.xz").read_bytes()
    assert archive_runs(rep, tmp_path / "again.tar.xz").read_bytes() == first  # deterministic
    with tarfile.open(tmp_path / "a" / "runs.tar.xz") as tar:
        names = tar.getnames()
        assert "sweep/strict/samples.jsonl" in names and not any("traces" in n for n in names)
        tar.extractall(tmp_path / "x", filter="data")
    monkeypatch.chdir(tmp_path / "x")
    build([Path("sweep")], tmp_path / "b")
    for f in sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.suffix in (".md", ".csv")):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f


def test_the_report_records_its_command(sweep_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(sweep_dir.parent)
    rc = main(["report", "sweep", "--out", str(tmp_path / "r"), "--bootstrap", "50", "--archive"])
    assert rc == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert f"vskip report sweep --out {tmp_path / 'r'} --bootstrap 50 --archive" in text
    assert (tmp_path / "r" / "runs.tar.xz").exists()


def test_the_promised_agreement_of_prefix_runs(tmp_path):
    """`--policy prefix --alpha A` runs get the realised disagreement (tokens committed beyond the
    shadow L over generated tokens, per prompt), their calls and speed against Strict SDD, in the
    report and in scheduler.json; other runs get none."""
    root = tmp_path / "s"
    write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True] * 4)
    # every prompt: 10 tokens, skips of (6, 6) and (6, 5): one wrong token of 10
    write_run(root / "prefix_a", "prefix", calls=4, blocks=6, seconds=0.8, passed=[True] * 4, relaxed=[(6, 6), (6, 5)],
              params={"survival": "model", "alpha": 0.05, "lam": 0.9})
    write_run(root / "prefix_b", "prefix", calls=3, blocks=6, seconds=0.5, passed=[True] * 4, relaxed=[(8, 8)],
              params={"survival": "model", "alpha": 0.02, "lam": 0.9})
    write_run(root / "prefix_lam", "prefix", calls=3, blocks=6, seconds=0.5, passed=[True] * 4, relaxed=[(8, 2)])
    rep, _ = build([root], tmp_path / "out")
    entries = json.loads((tmp_path / "out" / "scheduler.json").read_text())
    assert [(e["config"], e["alpha"]) for e in entries] == [("prefix_b", 0.02), ("prefix_a", 0.05)]
    b, a = entries
    assert a["realised_disagreement"] == pytest.approx(0.1) and not a["within_alpha"]
    assert b["realised_disagreement"] == 0.0 and b["within_alpha"] and b["realised_disagreement_ci95"] == [0.0, 0.0]
    assert a["relative_calls"] == pytest.approx(0.8) and a["tokens_per_s_ratio"] == pytest.approx(1.25)
    # Eq. 7 at Strict SDD's costs (c_D 0.05 s, c_V 0.12 s): 5 blocks and 5 calls, 0.85 s, against 6 and 4, 0.78 s
    assert a["eq7_tokens_per_s_ratio"] == pytest.approx(0.85 / 0.78) and a["eq7_tokens_per_s_ratio_ci95"][0] == pytest.approx(0.85 / 0.78)
    assert a["tokens_per_s_ratio_ci95"] == pytest.approx([1.25, 1.25]) and a["n_prompts"] == 4
    assert "Promised agreement" in (tmp_path / "out" / "report.md").read_text()
    # both kinds of prefix run are drawn as frontiers of their own, each with every one of its runs
    rows = next(iter(rep.rows.values()))
    fr = report.frontiers(rows, lambda r: r.rel_calls, lambda r: r.m.strict_token, False, True, k_min=6)
    assert {r.name for r, _ in fr["prefix-model"]} == {"prefix_a", "prefix_b"}
    assert {r.name for r, _ in fr["prefix"]} == {"prefix_lam"}
    write_run(tmp_path / "t" / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True] * 4)
    build([tmp_path / "t"], tmp_path / "out2")
    assert not (tmp_path / "out2" / "scheduler.json").exists()


def test_the_promise_over_the_tasks_it_was_calibrated_on(tmp_path):
    """The same alpha run on two tasks with one predictor: a row per task and one over both, with a
    verdict that tells a resolved excess from one inside the interval."""
    for task, relaxed in (("humaneval", [(6, 6), (6, 5)]), ("mbpp", [(6, 6)])):
        root = tmp_path / task
        write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True] * 4, task=task)
        write_run(root / "prefix_a", "prefix", calls=4, blocks=6, seconds=0.8, passed=[True] * 4, task=task,
                  relaxed=relaxed, params={"survival": "model", "alpha": 0.05, "lam": 0.9}, predictor="p0")
        # an on-policy round: the same configuration with another predictor, in a directory of its own
        write_run(tmp_path / f"{task}-round1" / "prefix_a", "prefix", calls=5, blocks=6, seconds=0.9,
                  passed=[True] * 4, task=task, relaxed=[(6, 6)],
                  params={"survival": "model", "alpha": 0.05, "lam": 0.9}, predictor="p1")
    build([tmp_path / "humaneval", tmp_path / "mbpp"], tmp_path / "out")
    entries = {e["task"]: e for e in json.loads((tmp_path / "out" / "scheduler.json").read_text())}
    assert set(entries) == {"humaneval", "mbpp", "humaneval+mbpp"}
    assert {e["predictor"] for e in entries.values()} == {"p0"}
    # with round 1 beside it: a pooled row per predictor, each saying which it is
    rep, _ = build([tmp_path / "humaneval", tmp_path / "mbpp", tmp_path / "humaneval-round1" / "prefix_a",
                    tmp_path / "mbpp-round1" / "prefix_a"], tmp_path / "out1")
    # the figures draw each round's model as a frontier of its own
    rows = next(rows for (task, _), rows in rep.rows.items() if task == "humaneval")
    fr = report.frontiers(rows, lambda r: r.rel_calls, lambda r: r.m.strict_token, False, True, k_min=6)
    assert {k for k in fr if k.startswith("prefix-model")} == {"prefix-model@p0", "prefix-model@p1"}
    assert (tmp_path / "out1" / "figd_humaneval_g16.png").exists()
    pooled = {e["predictor"]: e for e in json.loads((tmp_path / "out1" / "scheduler.json").read_text())
              if e["task"] == "humaneval+mbpp"}
    assert set(pooled) == {"p0", "p1"} and pooled["p1"]["realised_disagreement"] == 0.0
    assert pooled["p0"]["realised_disagreement"] == pytest.approx(0.05)
    he, both = entries["humaneval"], entries["humaneval+mbpp"]
    assert he["realised_disagreement"] == pytest.approx(0.1) and he["verdict"] == "exceeded"  # every prompt: 1 of 10
    assert entries["mbpp"]["verdict"] == "within"
    assert both["n_prompts"] == 8 and both["realised_disagreement"] == pytest.approx(0.05)
    assert both["verdict"] == "within" and both["relative_calls"] == pytest.approx(0.8)
    assert both["eq7_tokens_per_s_ratio"] == pytest.approx(0.85 / 0.78)  # both tasks alike
    assert (he["skips"], he["wrong_skip_share"], he["mean_skip"]) == (8, 0.5, 6.0)  # (6, 6) and (6, 5) per prompt
    assert (both["skips"], both["wrong_skip_share"]) == (12, pytest.approx(4 / 12))
    lo, hi = both["realised_disagreement_ci95"]
    assert lo < 0.05 < hi
    # one prompt of HumanEval over alpha, the rest at 0: above alpha, yet the interval holds it
    from vskip.study.prefix.calibrate import verdict

    assert verdict(0.06, (0.01, 0.12), 0.05) == "above, unresolved" and verdict(0.06, (0.055, 0.07), 0.05) == "exceeded"


def _prefix_and_raw(root: Path) -> list[bool]:
    """Strict SDD, two raw points and two prefix points on 4 prompts of 10 tokens each."""
    T = [True] * 4
    write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=T)
    # raw: StrictToken 1.0 at 0.8 calls, 0.5 at 0.6 calls
    write_run(root / "raw_hi", "raw", calls=4, blocks=6, seconds=0.9, passed=T, relaxed=[(6, 6)])
    write_run(root / "raw_lo", "raw", calls=3, blocks=6, seconds=0.8, passed=T, relaxed=[(6, 3)],
              params={"eta_b": 0.7, "eta_c": 0.7})
    # prefix A: StrictToken 1.0 at 0.6 calls, faster: beats raw_hi on both
    write_run(root / "prefix_a", "prefix", calls=3, blocks=6, seconds=0.7, passed=T, relaxed=[(6, 6)])
    # prefix B: StrictToken 0.5 at 0.8 calls, slower: beaten by raw_lo
    write_run(root / "prefix_b", "prefix", calls=4, blocks=6, seconds=0.95, passed=T, relaxed=[(4, 2)],
              params={"lam": 0.5})
    return T


def test_the_prefix_scheduler_against_raw_at_equal_agreement(tmp_path):
    root = tmp_path / "s"
    T = _prefix_and_raw(root)
    # the learned signals against raw too (H1), main grid only: a k_min-diagnostic run is left out
    write_run(root / "marg_a", "marginal", calls=5, blocks=6, seconds=1.0, passed=T, relaxed=[(6, 6)])
    write_run(root / "marg_k0", "marginal", calls=3, blocks=6, seconds=0.7, passed=T, relaxed=[(6, 6)],
              params={"k_min": 0})
    build([root], tmp_path / "out")
    md = (tmp_path / "out" / "marginal_vs_raw_humaneval_g16.md").read_text()
    assert "marg_k0" not in md
    m = next(line for line in md.splitlines() if line.startswith("| marg_a"))
    assert "raw_hi" in m and m.endswith("more calls, slower; Eq. 7: slower |")
    # Eq. 7 at Strict SDD's costs (c_D 0.05 s, c_V 0.12 s): 6 blocks and 5 calls against 6 and 4
    assert "0.8667 [0.8667, 0.8667]" in m
    assert "Marginal survival against raw confidence (H1)" in (tmp_path / "out" / "report.md").read_text()
    md = (tmp_path / "out" / "prefix_vs_raw_humaneval_g16.md").read_text()
    a = next(line for line in md.splitlines() if line.startswith("| prefix_a"))
    b = next(line for line in md.splitlines() if line.startswith("| prefix_b"))
    assert "raw_hi" in a and a.endswith("fewer calls, faster; Eq. 7: faster |")
    assert "0.7500 [0.7500, 0.7500]" in a  # 3 calls per 10 tokens over raw_hi's 4, on every prompt
    assert "1.1818 [1.1818, 1.1818]" in a  # 0.78 s over 0.66 s under Eq. 7
    assert "raw_lo" in b and b.endswith("more calls, slower; Eq. 7: slower |")
    # per generated token instead: prefix_b commits 2 wrong tokens of 10 and raw_lo 3, so only raw_hi
    # (none wrong) disagrees at most as much, and prefix_b makes as many calls as it
    md = (tmp_path / "out" / "prefix_vs_raw_disagreement_humaneval_g16.md").read_text()
    assert "≤ disagreement" in md.splitlines()[0]
    b = next(line for line in md.splitlines() if line.startswith("| prefix_b"))
    assert b.startswith("| prefix_b | 0.2000 | 0.8000 |") and "raw_lo" not in b and "raw_hi" in b
    assert "1.0000 [1.0000, 1.0000]" in b and b.endswith("calls unresolved, slower; Eq. 7: unresolved |"), b
    runs = (tmp_path / "out" / "runs_humaneval_g16.md").read_text()
    raw_lo = next(line for line in runs.splitlines() if line.startswith("| raw_lo"))
    assert "| 0.3000 |" in raw_lo and raw_lo.endswith("| 6.0000 | 1.0000 |")  # one skip of 6 per prompt, 3 beyond L
    iv = (tmp_path / "out" / "intervals_humaneval_g16.md").read_text()
    raw_hi = next(line for line in iv.splitlines() if line.startswith("| raw_hi"))
    assert "1.0897 [1.0897, 1.0897]" in raw_hi  # 0.85 s of Strict SDD under Eq. 7 over 0.78 s
    # the same calls on average but not on every prompt: the interval holds 1, the verdict says so
    lines = [json.loads(x) for x in (root / "prefix_a" / "samples.jsonl").read_text().splitlines()]
    for s, c, t in zip(lines, (2, 6, 2, 6), (0.5, 1.3, 0.5, 1.3)):
        s["verifier_calls"], s["decode_seconds"] = c, t
    (root / "prefix_a" / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in lines))
    build([root], tmp_path / "out2")
    md = (tmp_path / "out2" / "prefix_vs_raw_humaneval_g16.md").read_text()
    a = next(line for line in md.splitlines() if line.startswith("| prefix_a"))
    assert a.endswith("calls unresolved, speed unresolved; Eq. 7: unresolved |"), a


def test_compare_reports_ignores_timing_and_catches_the_rest(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_reports", Path(__file__).parents[1] / "scripts" / "compare_reports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    head = "config,method,tokens/s,rel. calls\n"
    (old / "runs_x.csv").write_text(head + "strict,Strict SDD,6.5,1.0\nraw_a,Raw,7.0,0.9\n")
    (new / "runs_x.csv").write_text(head + "strict,Strict SDD,7.1,1.0\nraw_a,Raw,6.2,0.9\n")
    assert mod.main([str(old), str(new)]) == 0  # only tokens/s differs: timing
    (new / "runs_x.csv").write_text(head + "strict,Strict SDD,7.1,1.0\nraw_a,Raw,6.2,0.8\n")
    assert mod.main([str(old), str(new)]) == 1
    assert "('raw_a',), rel. calls: '0.9' against '0.8'" in capsys.readouterr().out
    (new / "runs_x.csv").write_text(head + "strict,Strict SDD,7.1,1.0\n")
    assert mod.main([str(old), str(new)]) == 1 and mod.main([str(old), str(new), "--common"]) == 0


def test_the_prefix_scheduler_against_raws_frontier_read_between_its_points(tmp_path):
    """Raw's frontier read by a straight line at each prefix run's agreement: per generated token,
    prefix_b (2 wrong of 10) sits between raw_hi (0 wrong, 0.8 of Strict SDD's calls) and raw_lo (3
    wrong, 0.6), where the frontier makes 0.8 - (2/3) 0.2 of the calls; outside raw's range nothing
    is read."""
    root = tmp_path / "s"
    T = _prefix_and_raw(root)
    write_run(root / "prefix_c", "prefix", calls=2, blocks=6, seconds=0.6, passed=T, relaxed=[(8, 4)],
              params={"lam": 0.3})
    build([root], tmp_path / "out")
    lines = (tmp_path / "out" / "prefix_vs_raw_frontier_disagreement_humaneval_g16.md").read_text().splitlines()
    b = next(x for x in lines if x.startswith("| prefix_b"))
    assert "| 0.2000 | 0.8000 | raw_hi – raw_lo | 0.6667 |" in b and "1.2000 [1.2000, 1.2000]" in b
    # Eq. 7 at Strict SDD's costs (c_D 0.05 s, c_V 0.12 s): 0.85 s over 0.78 s for prefix_b and raw_hi, 0.66 s raw_lo
    read = 0.85 / 0.78 + (2 / 3) * (0.85 / 0.66 - 0.85 / 0.78)
    assert f"{(0.85 / 0.78) / read:.4f}" in b and b.endswith("calls: more; Eq. 7 speed: slower |")
    c = next(x for x in lines if x.startswith("| prefix_c"))
    assert "| 0.4000 |" in c and c.endswith("outside raw's observed range |")  # 4 wrong of 10, beyond raw_lo's 3
    lines = (tmp_path / "out" / "prefix_vs_raw_frontier_strict_token_humaneval_g16.md").read_text().splitlines()
    a = next(x for x in lines if x.startswith("| prefix_a"))
    assert "| 1.0000 | 0.6000 | raw_hi | 0.8000 |" in a and "0.7500 [0.7500, 0.7500]" in a and "calls: fewer" in a
    # Strict SDD is raw's limit: with raw_hi gone, prefix_b is read between Strict SDD and raw_lo
    import shutil

    shutil.rmtree(root / "raw_hi")
    build([root], tmp_path / "out2")
    lines = (tmp_path / "out2" / "prefix_vs_raw_frontier_disagreement_humaneval_g16.md").read_text().splitlines()
    b = next(x for x in lines if x.startswith("| prefix_b"))
    # at 0.2 of the way from Strict SDD (0, calls 1.0) to raw_lo (0.3, 0.6): 1.0 - (2/3) 0.4
    assert "| strict – raw_lo | 0.7333 | 1.0909 [1.0909, 1.0909] |" in b
    assert "Prefix scheduler against raw confidence's frontier" in (tmp_path / "out" / "report.md").read_text()


def test_labels_name_the_task_for_every_run_once_names_repeat(tmp_path):
    one = tmp_path / "one"
    write_run(one / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True] * 4)
    write_run(one / "raw", "raw", calls=4, blocks=6, seconds=0.8, passed=[True] * 4)
    rep, _ = build([one], tmp_path / "o1")
    assert set(rows_by_name(rep)) == {"strict", "raw"}  # one directory: the short names
    two = tmp_path / "two"
    write_run(two / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True] * 4, task="mbpp")
    rep, _ = build([one, two], tmp_path / "o2")
    # raw exists for one task only, and is still named with its task
    assert set(rows_by_name(rep)) == {"one/strict", "two/strict", "one/raw"}
