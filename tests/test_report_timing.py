"""A run's repeated timing (`vskip report --timing`): the configuration of a comparison that decodes
as the run did is found, and nothing else; its speed against Strict SDD is paired per prompt,
pooled over tasks, and lands in scheduler.json beside the run's single timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report import IDS, build, write_run

from vskip.engine.decode import DecodeConfig
from vskip.engine.models.config import ModelConfig
from vskip.engine.policy import PolicyConfig
from vskip.engine.runtime import Runtime
from vskip.report.timing import Timing, timed_fields
from vskip.study import compare
from vskip.study.runner import RunConfig
from vskip.study.variants import parse_variant

P_ALPHA = "prefix+survival=model+alpha=0.05"
SPECS = ("ar", "strict", P_ALPHA, "prefix+survival=model+alpha=0.02", P_ALPHA + "+predictor=p1",
         "raw+eta_b=0.7+eta_c=0.7+k_min=3")
#: seconds per prompt of each configuration in repeat 0 and 1 (every prompt makes 10 tokens)
SECONDS = {"ar": (4.0, 4.0), "strict": (2.0, 2.0), P_ALPHA: (1.0, 2.0), SPECS[3]: (1.5, 1.5), SPECS[4]: (1.6, 1.6),
           SPECS[5]: (1.8, 1.8)}


def _models(cache=True, dtype=None):
    return ModelConfig(threads=1, drafter_dtype="float32", verifier_cache=cache, dtype=dtype)


def comparison(d: Path, task="humaneval", ids=IDS, cache=True, max_new=256, dtype=None, specs=SPECS,
               seconds=SECONDS, batch_size=1) -> Path:
    """A comparison directory as `vskip compare --repeats 2 --predictor p0` writes it."""
    dec = DecodeConfig(gamma=8, max_new_tokens=max_new, task=task)
    variants = [parse_variant(s, dec, 1, "p0") for s in specs]
    compare.claim(d, compare.settings_record(task, max_new, Runtime(), _models(cache, dtype), variants, "p0",
                                             batch_size))
    rows = [{"task_id": t, "config": s, "repeat": q, "machine": "m", "tokens": 10,
             "seconds": seconds[s][q], "digest": "d", "output": [1]}
            for t in ids for q in (0, 1) for s in specs]
    (d / "shard-1-of-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def run_cfg(policy="prefix", task="humaneval", predictor="p0", cache=True, max_new=256, **params) -> dict:
    pol = PolicyConfig.make(policy, **params) if params else PolicyConfig.make(policy)
    cfg = RunConfig(task=task, policy=pol, decode=DecodeConfig(gamma=8, max_new_tokens=max_new, task=task),
                    models=_models(cache), predictor=predictor)
    return json.loads(json.dumps(cfg.to_json()))


def test_the_configuration_that_decodes_as_the_run_did(tmp_path):
    t = Timing(comparison(tmp_path / "c"))
    assert t.config_for(run_cfg(survival="model", alpha=0.05)) == P_ALPHA
    assert t.config_for(run_cfg(survival="model", alpha=0.02)) == SPECS[3]
    assert t.config_for(run_cfg(survival="model", alpha=0.05, predictor="p1")) == SPECS[4]  # its own predictor=
    assert t.config_for(run_cfg(survival="model", alpha=0.05, predictor="./p0")) == P_ALPHA  # the same path
    assert t.config_for(run_cfg("raw", predictor=None, eta_b=0.7, eta_c=0.7, k_min=3)) == SPECS[5]
    assert t.config_for(run_cfg("strict", predictor=None)) == "strict"
    for other in (run_cfg(survival="model", alpha=0.01), run_cfg(survival="model", alpha=0.05, predictor="p2"),
                  run_cfg(survival="model", alpha=0.05, task="mbpp"), run_cfg(survival="model", alpha=0.05, max_new=512),
                  run_cfg(survival="model", alpha=0.05, cache=False), run_cfg("raw", predictor=None, eta_b=0.7)):
        assert t.config_for(other) is None
    # a batch's clocks stand for that batch only (speculation pays less under load)
    batched = {**run_cfg(survival="model", alpha=0.05), "batch_size": 4}
    assert t.config_for(batched) is None
    four = Timing(comparison(tmp_path / "b4", batch_size=4))
    assert four.config_for(batched) == P_ALPHA and four.config_for(run_cfg(survival="model", alpha=0.05)) is None
    nocache = Timing(comparison(tmp_path / "n", cache=False))
    assert nocache.config_for(run_cfg(survival="model", alpha=0.05)) is None
    assert nocache.config_for(run_cfg(survival="model", alpha=0.05, cache=False)) == P_ALPHA
    (tmp_path / "bad").mkdir()
    with pytest.raises(ValueError, match="not a comparison directory"):
        Timing(tmp_path / "bad")


def test_the_timed_ratio_is_paired_per_prompt_and_pooled_over_tasks(tmp_path):
    he = Timing(comparison(tmp_path / "he"))
    mb = Timing(comparison(tmp_path / "mb", task="mbpp", ids=["Mbpp/11", "Mbpp/12"]))
    f = timed_fields([run_cfg(survival="model", alpha=0.05)], [mb, he])
    # 10 tokens in 1 + 2 seconds against 2 + 2: 4/3 pooled, 2 and 1 by repeat
    assert f["timed_tokens_per_s_ratio"] == pytest.approx(4 / 3) and f["timed_by_repeat"] == pytest.approx([2.0, 1.0])
    assert f["timed_prompts"] == len(IDS) and f["timed_in"] == [f"{tmp_path / 'he'} ({P_ALPHA})"]
    both = timed_fields([run_cfg(survival="model", alpha=0.05), run_cfg(survival="model", alpha=0.05, task="mbpp")],
                        [he, mb])
    assert both["timed_prompts"] == len(IDS) + 2 and both["timed_tokens_per_s_ratio"] == pytest.approx(4 / 3)
    assert timed_fields([run_cfg(survival="model", alpha=0.01)], [he]) == {}
    assert timed_fields([run_cfg(survival="model", alpha=0.05), run_cfg(survival="model", alpha=0.05, task="gsm8k")],
                        [he, mb]) == {}  # one task untimed: no pooled figure
    # a task whose comparison has not reached the configuration yet brings no prompts: no pooled figure either
    import shutil

    shutil.copytree(tmp_path / "mb", tmp_path / "mb2")
    rows = (tmp_path / "mb2" / "shard-1-of-1.jsonl").read_text().splitlines()
    (tmp_path / "mb2" / "shard-1-of-1.jsonl").write_text("".join(x + "\n" for x in rows if P_ALPHA + '"' not in x))
    assert timed_fields([run_cfg(survival="model", alpha=0.05), run_cfg(survival="model", alpha=0.05, task="mbpp")],
                        [he, Timing(tmp_path / "mb2")]) == {}
    # nor one timed with another verifier precision
    assert Timing(comparison(tmp_path / "bf", dtype="bfloat16")).config_for(run_cfg(survival="model", alpha=0.05)) is None


def test_the_report_puts_the_repeated_timing_beside_the_single_one(tmp_path):
    root = tmp_path / "s"
    write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True] * 4, gamma=8)
    write_run(root / "prefix_a", "prefix", calls=4, blocks=6, seconds=0.8, passed=[True] * 4, relaxed=[(6, 6), (6, 5)],
              gamma=8, params={"survival": "model", "alpha": 0.05}, predictor="p0")
    for name, cfg in (("strict", run_cfg("strict", predictor=None)), ("prefix_a", run_cfg(survival="model", alpha=0.05))):
        p = root / name / "config.json"
        p.write_text(json.dumps({**json.loads(p.read_text()), "run": {**cfg, "ids": list(IDS)}}))
    he = comparison(tmp_path / "he", ids=IDS[:3])  # the timing piece decodes a part of the run's prompts
    build([root], tmp_path / "out", timing=[he])
    (e,) = json.loads((tmp_path / "out" / "scheduler.json").read_text())
    assert e["tokens_per_s_ratio"] == pytest.approx(1.25)  # the run's own timing, 0.8 s against 1.0 s
    assert e["timed_tokens_per_s_ratio"] == pytest.approx(4 / 3) and e["timed_prompts"] == 3
    assert "timed_tokens_per_s_ratio" in (tmp_path / "out" / "scheduler.md").read_text()
    build([root], tmp_path / "plain")
    (e,) = json.loads((tmp_path / "plain" / "scheduler.json").read_text())
    assert e["timed_tokens_per_s_ratio"] is None and e["tokens_per_s_ratio"] == pytest.approx(1.25)


def test_the_k_min_diagnostic_reads_the_repeated_timing(tmp_path):
    from vskip import report

    raw = "raw+eta_b=0.7+eta_c=0.7+k_min="
    # timed again: k_min 0 the fastest (2.0 s against Strict SDD's 2.0 -> ratio 2), then 3, then 6
    secs = {"ar": (4.0, 4.0), "strict": (2.0, 2.0), raw + "0": (1.0, 1.0), raw + "3": (1.6, 1.6),
            raw + "6": (1.8, 1.8)}
    he = comparison(tmp_path / "he", specs=tuple(secs), seconds=secs)
    root = tmp_path / "s"
    write_run(root / "strict", "strict", calls=5, blocks=5, seconds=1.0, passed=[True] * 4, gamma=8)
    cfgs = {"strict": run_cfg("strict", predictor=None)}
    # the single timings say the opposite (drift): k_min 6 the fastest
    for k, sec in ((0, 0.9), (3, 0.8), (6, 0.7)):
        write_run(root / f"raw_k{k}", "raw", calls=4, blocks=6, seconds=sec, passed=[True] * 4, gamma=8,
                  params={"eta_b": 0.7, "eta_c": 0.7, "k_min": k})
        cfgs[f"raw_k{k}"] = run_cfg("raw", predictor=None, eta_b=0.7, eta_c=0.7, k_min=k)
    for name, cfg in cfgs.items():
        p = root / name / "config.json"
        p.write_text(json.dumps({**json.loads(p.read_text()), "run": {**cfg, "ids": list(IDS)}}))
    rep, _ = build([root], tmp_path / "out", timing=[he])
    rows = next(iter(rep.rows.values()))
    by = {r.name: r for r in rows}
    assert by["raw_k0"].timed_ratio == pytest.approx(2.0) and by["raw_k6"].timed_ratio == pytest.approx(2.0 / 1.8)
    assert by["strict"].timed == {}  # Strict SDD is the reference, not a timed configuration
    (f,) = report.kmin_families(rows)
    assert f.best == 6 and f.best_timed == 0 and f.best_timed_resolved is True
    assert f.predicted == 0 and f.agrees is False and f.agrees_timed is True
    out = tmp_path / "out"
    kmin = (out / "kmin_humaneval_g8.csv").read_text()
    assert "best k_min (timed)" in kmin and "2.0000 [2.0000, 2.0000]" in kmin
    timed = (out / "timed_humaneval_g8.csv").read_text().splitlines()
    assert len(timed) == 4 and timed[0].startswith("config,")  # the three raw runs
    assert "the fastest is k_min 0" in (out / "report.md").read_text()
    # without a timing of every k_min there is no timed best
    (f,) = report.kmin_families(next(iter(build([root], tmp_path / "plain")[0].rows.values())))
    assert f.best_timed is None and f.agrees_timed is None
    assert not (tmp_path / "plain" / "timed_humaneval_g8.csv").exists()
