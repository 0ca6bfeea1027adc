"""scripts/fullscale.sh's on-policy rounds, with a stub in place of vskip that records each command
and writes the files the real one would: which model each round decodes with, which blocks it
trains and calibrates on, where it writes, and what the reports put side by side."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "fullscale.sh"

STUB = """#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG"
out=""
prev=""
for a in "$@"; do
  if [ "$prev" = "--out" ]; then out="$a"; fi
  prev="$a"
done
case "$1" in
  run) mkdir -p "$out" && echo '{"n_prompts": 1}' > "$out/summary.json" && echo '{}' > "$out/config.json" ;;
  train-predictor) mkdir -p "$out/prefix" && echo '{}' > "$out/prefix/manifest.json" ;;
  report) mkdir -p "$out" && printf '["%s"]' "$out" > "$out/scheduler.json" ;;
esac
"""


@pytest.fixture
def env(tmp_path):
    stub = tmp_path / "vskip"
    stub.write_text(STUB)
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    R, A = tmp_path / "runs", tmp_path / "results"
    strict = {"n_prompts": 2, "generated_tokens": 10, "verifier_calls": 4, "draft_blocks": 4, "pass_at_1": 0.5}
    for t in ("humaneval", "mbpp"):
        for d in (R / "traces" / t, A / "traces" / t):
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps(strict))
    (A / "predictors" / "prefix").mkdir(parents=True)
    (A / "predictors" / "prefix" / "manifest.json").write_text("{}")
    e = {**os.environ, "VSKIP": str(stub), "PY": sys.executable, "R": str(R), "A": str(A),
         "STUB_LOG": str(tmp_path / "log"), "HE": "2", "MBPP": "2"}
    return e, R, A, tmp_path / "log"


def _step(env, step, round_=1):
    e = {**env, "ROUND": str(round_)}
    return subprocess.run(["bash", str(SCRIPT), step], env=e, capture_output=True, text=True, timeout=60)


def _calls(log, verb):  # the two tasks run side by side: their order within a step is either
    return [line.split() for line in log.read_text().splitlines() if line.startswith(verb + " ")]


def test_each_round_decodes_with_the_last_model_and_trains_on_every_round(env):
    e, R, A, log = env
    assert _step(e, "onpolicy", 2).returncode == 2  # round 2 needs round 1's model and blocks
    p = _step(e, "onpolicy", 1)
    assert p.returncode == 0, p.stderr
    p = _step(e, "onpolicy", 2)
    assert p.returncode == 0, p.stderr
    runs = _calls(log, "run")
    assert [r[r.index("--predictor") + 1] for r in runs] == [f"{A}/predictors"] * 2 + [f"{A}/predictors-round1"] * 2
    assert sorted(r[r.index("--out") + 1] for r in runs[2:]) == [f"{R}/onpolicy2/humaneval", f"{R}/onpolicy2/mbpp"]
    train = _calls(log, "train-predictor")[-1]
    assert " ".join(train[train.index("--on-policy"):train.index("--calibrate-on")]) == (
        f"--on-policy {R}/onpolicy1/humaneval {R}/onpolicy1/mbpp --on-policy {R}/onpolicy2/humaneval {R}/onpolicy2/mbpp")
    assert train[train.index("--calibrate-on") + 1] == "on-policy" and train[train.index("--out") + 1] == f"{A}/predictors-round2"
    assert (A / "onpolicy2" / "mbpp" / "summary.json").exists()

    # round 2 offline: round 1 and round 2 replayed on round 2's blocks; online: round 2's model
    assert _step(e, "onpolicy-check", 2).returncode == 0
    diag = [d[d.index("--out") + 1] for d in _calls(log, "diagnose")]
    assert diag == [f"{A}/diagnose-onpolicy2-round1", f"{A}/diagnose-onpolicy2-round2"]
    assert _step(e, "onpolicy-sweep", 2).returncode == 0
    sweeps = _calls(log, "sweep")
    assert {s[s.index("--predictor") + 1] for s in sweeps} == {f"{A}/predictors-round2"}
    assert sorted(s[s.index("--out") + 1] for s in sweeps) == [f"{R}/sweeps-round2/humaneval-round2",
                                                              f"{R}/sweeps-round2/mbpp-round2"]


def test_pack_sets_each_round_beside_strict_round_0_and_the_earlier_rounds(env):
    e, R, A, log = env
    a = "prefix_model_a0.05_measured_s64"
    raw = "raw_eb0.70_ec0.70_k3_s64"
    for d in ("sweeps/humaneval/strict", f"sweeps/humaneval/{a}", f"sweeps/humaneval/{raw}",
              "sweeps/humaneval/raw_eb0.70_ec0.70_k0_s64", f"sweeps-round1/humaneval-round1/{a}",
              f"sweeps-round2/humaneval-round2/{a}"):
        (R / d).mkdir(parents=True)
    p = _step(e, "pack")
    assert p.returncode == 0, p.stderr
    reports = {r[r.index("--out") + 1]: r[1:r.index("--frontier-k-min")] for r in _calls(log, "report")}
    # raw confidence's frontier beside each round (its k_min 3 settings; the k_min diagnostic is not a frontier)
    assert reports[f"{A}/report-round1"] == [f"{R}/sweeps-round1/humaneval-round1", f"{R}/sweeps/humaneval/strict",
                                              f"{R}/sweeps/humaneval/{a}", f"{R}/sweeps/humaneval/{raw}"]
    assert reports[f"{A}/report-round2"] == [f"{R}/sweeps-round2/humaneval-round2", f"{R}/sweeps/humaneval/strict",
                                              f"{R}/sweeps/humaneval/{a}", f"{R}/sweeps/humaneval/{raw}",
                                              f"{R}/sweeps-round1/humaneval-round1/{a}"]
    assert not any("--timing" in r for r in _calls(log, "report"))
    # docs/results/scheduler.json is the newest round's, which holds every round beside round 0
    assert json.loads((A.parent / "scheduler.json").read_text()) == [f"{A}/report-round2"]
    # with the repeated timings: compressed into A, and every report reads them from there
    t = R / "timing" / "humaneval-cache"
    t.mkdir(parents=True)
    (t / "settings.json").write_text("{}")
    (t / "shard-1-of-2.jsonl").write_text("{}\n")
    log.write_text("")
    p = _step(e, "pack")
    assert p.returncode == 0, p.stderr
    assert (A / "timing" / "humaneval-cache" / "shard-1-of-2.jsonl.gz").exists()
    reports = _calls(log, "report")
    assert len(reports) == 3
    assert all(r[r.index("--timing") + 1:r.index("--archive")] == [f"{A}/timing/humaneval-cache"] for r in reports)


def test_timing_times_every_key_point_with_the_cache_and_humaneval_without(env):
    e, R, A, log = env
    e = {**e, "HE": "9", "MBPP": "9"}
    p = _step(e, "timing")
    assert p.returncode == 0, p.stderr
    outs = sorted(c[c.index("--out") + 1] for c in _calls(log, "compare"))
    assert outs == sorted([f"{R}/timing/humaneval-cache"] * 2 + [f"{R}/timing/mbpp-cache"] * 2
                          + [f"{R}/timing/humaneval-nocache"] * 2)
    nocache = [c for c in _calls(log, "compare") if "--no-verifier-cache" in c]
    # every 8th of the first 9 prompts, with the cache and without
    ids = {c[c.index("--out") + 1].split("/")[-1]: c[c.index("--ids") + 1] for c in _calls(log, "compare")}
    assert ids["humaneval-cache"] == ids["humaneval-nocache"] == "HumanEval/0,HumanEval/8"
    assert len(ids["mbpp-cache"].split(",")) == 2
    assert {c[c.index("--ids") + 1] for c in nocache} == {"HumanEval/0,HumanEval/8"}
    assert all(c[c.index("--repeats") + 1] == "3" for c in _calls(log, "compare") if "--verifier-cache" in c)
    # the model of the second on-policy round is timed beside the first one's, both with and without the cache
    configs = [c[c.index("--configs") + 1].split(",") for c in _calls(log, "compare")]
    r2 = f"prefix+survival=model+predictor={A}/predictors-round2+alpha="
    assert all(r2 + "0.05" in k for k in configs)
    raw = "raw+eta_b=0.7+eta_c=0.7+k_min="
    assert all({r2 + "0.02", r2 + "0.01", raw + "0", raw + "3", raw + "6"} <= set(k)
               for k, c in zip(configs, _calls(log, "compare")) if "--verifier-cache" in c)


def test_only_narrows_a_step_to_one_task_and_refuses_the_rest(env):
    e, R, A, log = env
    p = _step({**e, "ONLY": "mbpp"}, "sweep")
    assert p.returncode == 0, p.stderr
    tasks = [c[c.index("--task") + 1] for c in _calls(log, "sweep")]
    assert tasks == ["mbpp"]
    p = _step({**e, "ONLY": "humaneval"}, "timing")
    assert p.returncode == 0, p.stderr
    assert {c[c.index("--task") + 1] for c in _calls(log, "compare")} == {"humaneval"}
    for step, only in (("sweep", "gsm8k"), ("pack", "mbpp"), ("onpolicy", "mbpp")):
        p = _step({**e, "ONLY": only}, step)
        assert p.returncode == 2 and "ONLY" in p.stderr


# ----------------------------------------------------------------------------- scripts/online.sh

ONLINE = ROOT / "scripts" / "online.sh"


def _online(env, step):
    return subprocess.run(["bash", str(ONLINE), step], env=env, capture_output=True, text=True, timeout=60)


def test_online_chooses_on_the_thresholds_every_task_finished_and_fails_loudly(env):
    e, _, _, log = env
    R, A = Path(e["R"]) / "online", Path(e["A"]) / "online"
    e = {**e, "R": str(R), "A": str(A)}
    assert _online(e, "choose").returncode == 1  # nothing decoded yet: refused, not a silent success
    for t, lams in (("humaneval", ("0.95", "0.90", "0.85")), ("mbpp", ("0.95", "0.90"))):
        for lam in lams:
            d = R / "cal" / t / f"prefix_model_lam{lam}_r0.22_s64"
            d.mkdir(parents=True)
            (d / "summary.json").write_text("{}")
    (R / "cal" / "mbpp" / "prefix_model_lam0.85_r0.22_s64").mkdir()  # unfinished on MBPP: left out
    assert _online(e, "choose").returncode == 0
    (choose,) = _calls(log, "calibrate-online")
    runs = [a for a in choose if a.startswith(str(R))]
    assert sorted(Path(r).name for r in runs) == sorted(["prefix_model_lam0.95_r0.22_s64"] * 2
                                                        + ["prefix_model_lam0.90_r0.22_s64"] * 2)
    assert choose[-4:] == ["--alpha", "0.05", "--alpha", "0.02"]
    assert _online(e, "bogus").returncode == 2
