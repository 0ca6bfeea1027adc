"""The full-scale study's pieces (``vskip fullscale``) and the online calibration's steps
(``vskip calibrate-online sweep|finished``), with a runner that records each vskip command and
writes the files the real one would: which model each round decodes with, which blocks it trains
and calibrates on, where it writes, which runs each report sets side by side, and that the
committed reports were made by exactly the commands these pieces give."""

import gzip
import io
import json
import re
import shlex
import shutil
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from vskip.study import fullscale as fsm
from vskip.study.fullscale import FullScale
from vskip.study.grids import grid
from vskip.study.jobs import Processes, deadline
from vskip.study.prefix import online

ROOT = Path(__file__).parents[1]
FULL = ROOT / "docs" / "results" / "full"
STRICT = {"n_prompts": 2, "generated_tokens": 10, "verifier_calls": 4, "draft_blocks": 4, "pass_at_1": 0.5}


def _out(cmd):
    return Path(cmd[cmd.index("--out") + 1])


class FakeRunner:
    """Records every command; a run writes its summary and config, a training its manifest, a
    report its scheduler.json naming itself. ``stop``: the deadline stops the timed commands
    before they write anything."""

    def __init__(self, stop=False):
        self.calls, self.stop = [], stop

    def __call__(self, commands, *, timed=False, quiet=False):
        self.calls += [list(c) for c in commands]
        if timed and self.stop:
            return False
        for c in commands:
            if c[0] == "run":
                _out(c).mkdir(parents=True, exist_ok=True)
                strict = c[c.index("--policy") + 1] == "strict"
                (_out(c) / "summary.json").write_text(json.dumps(STRICT) if strict else '{"n_prompts": 1}')
                (_out(c) / "config.json").write_text("{}")
            elif c[0] == "train-predictor":
                kind = c[c.index("--kind") + 1]
                (_out(c) / kind).mkdir(parents=True, exist_ok=True)
                (_out(c) / kind / "manifest.json").write_text("{}")
            elif c[0] == "report":
                _out(c).mkdir(parents=True, exist_ok=True)
                (_out(c) / "scheduler.json").write_text(json.dumps([str(_out(c))]))
        return True

    def verb(self, verb):
        return [c for c in self.calls if c[0] == verb]


@pytest.fixture
def study(tmp_path):
    R, A = tmp_path / "runs", tmp_path / "results"
    for t in ("humaneval", "mbpp"):
        for d in (R / "traces" / t, A / "traces" / t):
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps(STRICT))
    (A / "predictors" / "prefix").mkdir(parents=True)
    (A / "predictors" / "prefix" / "manifest.json").write_text("{}")
    return FullScale(runs=R, results=A, limits=(("humaneval", 2), ("mbpp", 2)))


def _round(fs, r):
    return replace(fs, round=r)


def test_each_round_decodes_with_the_last_model_and_trains_on_every_round(study):
    R, A = study.runs, study.results
    run = FakeRunner()
    with pytest.raises(ValueError, match="no model of round 1"):  # round 2 needs round 1's model and blocks
        fsm.onpolicy(_round(study, 2), run)
    fsm.onpolicy(study, run)
    fsm.onpolicy(_round(study, 2), run)
    runs = run.verb("run")
    assert [r[r.index("--predictor") + 1] for r in runs] == [str(A / "predictors")] * 2 + [
        str(A / "predictors-round1")] * 2
    assert all(r[r.index("--alpha") + 1] == "0.05" and "--trace" in r for r in runs)
    assert [_out(r) for r in runs[2:]] == [R / "onpolicy2" / "humaneval", R / "onpolicy2" / "mbpp"]
    train = run.verb("train-predictor")[-1]
    assert train[train.index("--on-policy"):train.index("--calibrate-on")] == [
        "--on-policy", str(R / "onpolicy1" / "humaneval"), str(R / "onpolicy1" / "mbpp"),
        "--on-policy", str(R / "onpolicy2" / "humaneval"), str(R / "onpolicy2" / "mbpp")]
    assert train[train.index("--calibrate-on") + 1] == "on-policy" and _out(train) == A / "predictors-round2"
    assert (A / "onpolicy2" / "mbpp" / "summary.json").read_text() == '{"n_prompts": 1}'

    # round 2 offline: round 1 and round 2 replayed on round 2's blocks; online: round 2's model
    fsm.onpolicy_check(_round(study, 2), run)
    assert [_out(d) for d in run.verb("diagnose")] == [A / "diagnose-onpolicy2-round1", A / "diagnose-onpolicy2-round2"]
    fsm.onpolicy_sweep(_round(study, 2), run)
    sweeps = run.verb("sweep")
    assert {s[s.index("--predictor") + 1] for s in sweeps} == {str(A / "predictors-round2")}
    assert {s[s.index("--grid") + 1] for s in sweeps} == {"promise"}
    assert [_out(s) for s in sweeps] == [R / "sweeps-round2" / "humaneval-round2", R / "sweeps-round2" / "mbpp-round2"]


def test_a_round_needs_the_earlier_rounds_blocks_and_the_same_strict_traces(study):
    (study.results / "predictors-round1" / "prefix").mkdir(parents=True)
    (study.results / "predictors-round1" / "prefix" / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match="trains on round 1's blocks too"):
        fsm.onpolicy(_round(study, 2), FakeRunner())
    other = {**STRICT, "verifier_calls": 5}
    (study.runs / "traces" / "mbpp" / "summary.json").write_text(json.dumps(other))
    run = FakeRunner()
    with pytest.raises(RuntimeError, match="traces of mbpp made here differ"):
        fsm.onpolicy(study, run)
    assert run.calls == []  # nothing decoded on traces that differ


def test_a_round_stopped_at_the_deadline_trains_nothing_and_resumes(study):
    run = FakeRunner(stop=True)
    fsm.onpolicy(study, run)  # stopped: not a failure
    assert [c[0] for c in run.calls] == ["run", "run"]
    assert not (study.results / "predictors-round1").exists()

    class Unfinished(FakeRunner):  # finished, but a run wrote no summary: a failure
        def __call__(self, commands, **kw):
            self.calls += [list(c) for c in commands]
            return True

    with pytest.raises(RuntimeError, match="on-policy run of humaneval, mbpp is unfinished"):
        fsm.onpolicy(study, Unfinished())


def test_a_fresh_machine_makes_the_traces_again_first(study):
    for t in ("humaneval", "mbpp"):
        (study.runs / "traces" / t / "summary.json").unlink()
    run = FakeRunner()
    fsm.onpolicy(study, run)
    assert [c[c.index("--policy") + 1] for c in run.calls[:4]] == ["strict", "strict", "prefix", "prefix"]
    assert [_out(c) for c in run.calls[:2]] == [study.runs / "traces" / "humaneval", study.runs / "traces" / "mbpp"]
    assert all("--trace" in c and c[c.index("--drafter-dtype") + 1] == "float32" for c in run.calls[:4])


def test_pack_sets_each_round_beside_strict_round_0_and_the_earlier_rounds(study):
    R, A = study.runs, study.results
    a, raw = "prefix_model_a0.05_measured_s64", "raw_eb0.70_ec0.70_k3_s64"
    for d in ("sweeps/humaneval/strict", f"sweeps/humaneval/{a}", f"sweeps/humaneval/{raw}",
              "sweeps/humaneval/raw_eb0.70_ec0.70_k0_s64", f"sweeps-round1/humaneval-round1/{a}",
              f"sweeps-round2/humaneval-round2/{a}"):
        (R / d).mkdir(parents=True)
    run = FakeRunner()
    fsm.pack(study, run)
    reports = {_out(r): r[1:r.index("--frontier-k-min")] for r in run.verb("report")}
    # raw confidence's frontier beside each round (its k_min 3 settings; the k_min diagnostic is not a frontier)
    beside = [str(R / "sweeps/humaneval" / d) for d in ("strict", a, raw)]
    assert reports == {A / "report": [str(R / "sweeps/humaneval")],
                       A / "report-round1": [str(R / "sweeps-round1/humaneval-round1"), *beside],
                       A / "report-round2": [str(R / "sweeps-round2/humaneval-round2"), *beside,
                                             str(R / f"sweeps-round1/humaneval-round1/{a}")]}
    assert all(r[r.index("--frontier-k-min") + 1] == "3" and "--timing" not in r for r in run.verb("report"))
    # docs/results/scheduler.json is the newest round's, which holds every round beside round 0
    assert json.loads((A.parent / "scheduler.json").read_text()) == [str(A / "report-round2")]


def test_pack_compresses_the_timing_rows_and_keeps_committed_bytes(study):
    R, A = study.runs, study.results
    t = R / "timing" / "humaneval-cache"
    t.mkdir(parents=True)
    (t / "settings.json").write_text("{}")
    (t / "shard-1-of-2.jsonl").write_text('{"a": 1}\n')
    (R / "sweeps" / "mbpp").mkdir(parents=True)
    run = FakeRunner()
    fsm.pack(study, run)
    gz = A / "timing" / "humaneval-cache" / "shard-1-of-2.jsonl.gz"
    assert gzip.decompress(gz.read_bytes()) == b'{"a": 1}\n'
    assert run.verb("compare") == [["compare", "--summary", "--out", str(gz.parent)]]
    (report,) = run.verb("report")
    assert report[report.index("--timing") + 1:report.index("--archive")] == [str(gz.parent)]
    committed = gzip.compress(b'{"a": 1}\n', compresslevel=1, mtime=1)  # other bytes, the same rows: kept
    gz.write_bytes(committed)
    fsm.pack(study, FakeRunner())
    assert gz.read_bytes() == committed
    (t / "shard-1-of-2.jsonl").write_text('{"a": 1}\n{"a": 2}\n')  # more rows: compressed again
    fsm.pack(study, FakeRunner())
    assert gzip.decompress(gz.read_bytes()) == b'{"a": 1}\n{"a": 2}\n'


def test_unpack_restores_the_archives_and_the_timing_rows_and_keeps_newer_files(study, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    A = study.results

    def archive(path, members):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:xz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(buf.getvalue())

    archive(A / "report" / "runs.tar.xz", {"x/sweeps/he/strict/summary.json": b"old",
                                           "x/sweeps/he/strict/c.json": b"c"})
    archive(A / "report-round1" / "runs.tar.xz", {"x/sweeps-round1/he/a/summary.json": b"r1"})
    (A / "timing" / "he-cache").mkdir(parents=True)
    (A / "timing" / "he-cache" / "settings.json").write_text("{}")
    (A / "timing" / "he-cache" / "shard-1-of-2.jsonl.gz").write_bytes(gzip.compress(b"rows\n"))
    (tmp_path / "x/sweeps/he/strict").mkdir(parents=True)
    (tmp_path / "x/sweeps/he/strict/summary.json").write_text("newer")
    written = fsm.unpack(study)
    assert (tmp_path / "x/sweeps/he/strict/summary.json").read_text() == "newer"
    assert (tmp_path / "x/sweeps/he/strict/c.json").read_text() == "c"
    assert (tmp_path / "x/sweeps-round1/he/a/summary.json").read_text() == "r1"
    assert (study.runs / "timing/he-cache/shard-1-of-2.jsonl").read_text() == "rows\n"
    assert len(written) == 3
    archive(A / "report" / "runs.tar.xz", {"../evil": b"x"})
    with pytest.raises(ValueError, match="outside the directory"):
        fsm.unpack(study)
    assert not (tmp_path.parent / "evil").exists()


def test_timing_times_every_key_point_with_the_cache_and_humaneval_without(study):
    fs = replace(study, limits=(("humaneval", 9), ("mbpp", 9)))
    run = FakeRunner()
    fsm.timing(fs, run)
    outs = [str(_out(c).name) for c in run.calls]
    assert outs == ["humaneval-cache"] * 2 + ["mbpp-cache"] * 2 + ["humaneval-nocache"] * 2
    ids = {_out(c).name: c[c.index("--ids") + 1] for c in run.calls}
    assert ids["humaneval-cache"] == ids["humaneval-nocache"] == "HumanEval/0,HumanEval/8"
    assert len(ids["mbpp-cache"].split(",")) == 2
    assert [c[c.index("--shard") + 1] for c in run.calls] == ["1/2", "2/2"] * 3
    assert all(c[c.index("--repeats") + 1] == ("3" if "--verifier-cache" in c else "1") for c in run.calls)
    stopped = FakeRunner(stop=True)
    fsm.timing(fs, stopped)  # the deadline: nothing after the first pair
    assert len(stopped.calls) == 2


def test_the_timed_configurations_are_those_the_committed_timings_hold():
    fs = FullScale()
    for name, cache in (("humaneval-cache", True), ("mbpp-cache", True), ("humaneval-nocache", False)):
        settings = json.loads((FULL / "timing" / name / "settings.json").read_text())
        assert fs.timed_configs(cache).split(",") == list(settings["configs"]), name
    assert FullScale(key="ar,strict").timed_configs(True) == "ar,strict"


def _runs_of_archives(root: Path, archives):
    """The run directories the committed archives hold, made (empty) under ``root``."""
    for a in archives:
        with tarfile.open(a, "r:xz") as tar:
            for name in tar.getnames():
                (root / name).parent.mkdir(parents=True, exist_ok=True)


def _made_by(report_md: Path) -> str:
    lines = report_md.read_text().splitlines()
    return lines[lines.index("```") + 1]


def test_the_committed_reports_were_made_by_the_commands_pack_gives(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    _runs_of_archives(tmp_path, sorted(FULL.glob("report*/runs.tar.xz")))
    cmds = fsm.report_commands(FullScale())
    assert [_out(c) for c in cmds] == [Path("docs/results/full/report"), Path("docs/results/full/report-round1"),
                                       Path("docs/results/full/report-round2")]
    for c in cmds:
        assert shlex.join(["vskip", *c]) == _made_by(_out(c) / "report.md")


def test_only_narrows_sweep_to_one_task_and_the_command_refuses_it_elsewhere(study):
    run = FakeRunner()
    fsm.sweep(replace(study, only="mbpp"), run)
    assert [c[c.index("--task") + 1] for c in run.calls] == ["mbpp"]
    assert [c[c.index("--grid") + 1] for c in run.calls] == ["full"]
    with pytest.raises(ValueError, match="not a task of the study"):
        FullScale(only="gsm8k")
    with pytest.raises(ValueError, match="tasks of vskip"):
        FullScale(limits=(("nosuchtask", 3),))
    from vskip.commands import build_parser

    for argv in (["fullscale", "pack", "--only", "mbpp"], ["fullscale", "sweep", "--limit", "gsm8k=3"]):
        a = build_parser().parse_args(argv)
        with pytest.raises(ValueError, match="--only narrows|the study's tasks"):
            a.fn(a)


def test_the_command_names_every_piece():
    from vskip.commands import fullscale

    assert fullscale.STEP_NAMES == tuple(fsm.STEPS)


def test_train_trains_each_model_once_and_diagnoses_on_one_thread(study):
    for t in ("humaneval", "mbpp"):
        (study.runs / "traces" / t / "config.json").write_text("{}")
    (study.results / "predictors" / "marginal").mkdir()
    (study.results / "predictors" / "marginal" / "manifest.json").write_text("{}")
    run = FakeRunner()
    fsm.train(study, run)
    assert [c[c.index("--kind") + 1] for c in run.verb("train-predictor")] == ["conditional"]
    (diag,) = run.verb("diagnose")
    assert diag[diag.index("--threads") + 1] == "1" and _out(diag) == study.results / "diagnose"
    assert (study.results / "traces" / "mbpp" / "config.json").exists()


# ----------------------------------------------------------------------------- running the pieces


def test_deadline_reads_a_time_of_today_or_a_date():
    import datetime as dt

    now = dt.datetime(2026, 3, 1, 10, 0)
    assert deadline("08:40", now) == dt.datetime(2026, 3, 1, 8, 40).timestamp()  # past: the piece does not start
    assert deadline("2026-03-02 01:05", now) == dt.datetime(2026, 3, 2, 1, 5).timestamp()
    assert deadline(None) is None
    with pytest.raises(ValueError, match="HH:MM"):
        deadline("tonight")


def test_processes_stop_at_the_deadline_and_name_a_failure(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "python"
    fake.write_text('#!/usr/bin/env bash\ncase "$3" in sleep) exec sleep 30 ;; fail) exit 3 ;; esac\n')
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    assert Processes(None)([["ok"], ["ok"]], timed=True)
    with pytest.raises(RuntimeError, match="`vskip fail` exited 3"):
        Processes(None)([["ok"], ["fail"]])
    t0 = time.time()
    assert not Processes(time.time() + 1.5, margin=0)([["sleep"], ["ok"]], timed=True)
    assert time.time() - t0 < 15
    assert not Processes(time.time() + 30, what="fullscale")([["fail"]], timed=True)  # too close to start
    assert "fullscale: the deadline has passed" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the online calibration


def _online_predictor(path):
    path.mkdir()  # `init` wrote the one-rotation model there
    online.write_ids(path, ["HumanEval/1", "Mbpp/2", "HumanEval/3"], ["HumanEval/4", "Mbpp/5"])
    return path


def test_online_ids_per_task_and_the_sweeps_that_decode_them(tmp_path):
    p = _online_predictor(tmp_path / "p")
    assert (p / "ids" / "humaneval.cal").read_text() == "HumanEval/1,HumanEval/3\n"
    assert online.read_ids(p, "test") == {"humaneval": "HumanEval/4", "mbpp": "Mbpp/5"}
    cmds = online.sweep_commands(p, "cal", tmp_path / "cal", 128)
    assert [(c[c.index("--task") + 1], c[c.index("--grid") + 1], c[c.index("--ids") + 1], _out(c)) for c in cmds] == [
        ("humaneval", "online-cal", "HumanEval/1,HumanEval/3", tmp_path / "cal" / "humaneval"),
        ("mbpp", "online-cal", "Mbpp/2", tmp_path / "cal" / "mbpp")]
    assert {c[c.index("--grid") + 1] for c in online.sweep_commands(p, "test", tmp_path / "t", 128)} == {"online-test"}
    with pytest.raises(ValueError, match="no cal prompt ids"):
        online.read_ids(tmp_path, "cal")


class _InProcess:
    """Stands in for :class:`Processes`: runs each vskip command in this process, in turn."""

    def __init__(self, until=None, what="vskip"):
        pass

    def __call__(self, commands, *, timed=False, quiet=False):
        from vskip.cli import main

        for c in commands:
            assert main(list(map(str, c))) == 0, c
        return True


@pytest.mark.parametrize("batch", [2, 3])
def test_online_sweeps_decode_at_the_batch_size_and_give_batch_ones_runs(tmp_path, monkeypatch, batch):
    """`calibrate-online sweep cal P --batch-size B` hands B to each task's `vskip sweep`, whose runs
    (every threshold of grid online-cal, on the fake pair with a stub prefix model) decode B
    prompts side by side and hold what batch 1 decodes, the batch size recorded; the parser
    refuses a bad value."""
    from fakes import FakeVerifier, StubPredictor
    from test_sweep import fake_pair

    import vskip.study.jobs
    import vskip.study.predictor
    from vskip.cli import build_parser
    from vskip.study import sweep

    p = tmp_path / "p"
    p.mkdir()
    online.write_ids(p, ["HumanEval/1", "Mbpp/12", "HumanEval/3", "Mbpp/11", "HumanEval/5"], ["HumanEval/4"])
    assert [c[c.index("--batch-size") + 1] for c in online.sweep_commands(p, "cal", tmp_path, 24, 1, batch)] == \
        [str(batch)] * 2
    slots = []

    class Verifier(FakeVerifier):
        def open_slots(self, n):
            slots.append(n)

    def pair(models, need_drafter):
        out = fake_pair(models, need_drafter)
        out.verifier = Verifier()
        return out

    monkeypatch.setattr(vskip.study.jobs, "Processes", _InProcess)
    monkeypatch.setattr(sweep, "load_models", pair)
    monkeypatch.setattr(vskip.study.predictor, "load_predictor", lambda d, kind, runtime=None: StubPredictor(2.0))

    def calibrate(out, b):
        a = build_parser().parse_args(["calibrate-online", "sweep", "cal", str(p), "--out", str(out),
                                       "--max-new-tokens", "24", "--batch-size", str(b)])
        assert a.fn(a) == 0
        runs = {}
        for d in sorted(out.glob("*/*/config.json")):
            run = json.loads(d.read_text())["run"]
            samples = sorted((json.loads(l) for l in (d.parent / "samples.jsonl").read_text().splitlines()),
                             key=lambda r: r["task_id"])
            runs[d.parent.relative_to(out)] = (run.pop("batch_size"), run,
                                               [(r["task_id"], r["tokens"], r["skipped_rounds"]) for r in samples])
        return runs

    one = calibrate(tmp_path / "one", 1)
    assert set(slots) == {1}
    slots.clear()
    many = calibrate(tmp_path / "many", batch)
    assert set(slots) == {batch}
    assert len(one) == 2 * len(grid("online-cal")) and set(many) == set(one)
    assert {k: v[1:] for k, v in many.items()} == {k: v[1:] for k, v in one.items()}
    assert {v[0] for v in one.values()} == {1} and {v[0] for v in many.values()} == {batch}
    assert any(n for v in one.values() for _, _, n in v[2])  # the thresholds skip rounds
    for bad in ("0", "-1", "1025"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["calibrate-online", "sweep", "cal", str(p), "--out", "o", "--max-new-tokens",
                                       "8", "--batch-size", bad])


def test_online_chooses_on_the_thresholds_every_task_finished(tmp_path):
    p, cal = _online_predictor(tmp_path / "p"), tmp_path / "cal"
    assert online.finished(p, cal) == []
    names = {pt.policy.lam: pt.name for pt in grid("online-cal")}
    for t, lams in (("humaneval", (0.95, 0.90, 0.85)), ("mbpp", (0.95, 0.90))):
        for lam in lams:
            (cal / t / names[lam]).mkdir(parents=True)
            (cal / t / names[lam] / "summary.json").write_text("{}")
    (cal / "mbpp" / names[0.85]).mkdir()  # unfinished on MBPP: left out
    assert online.finished(p, cal) == [cal / t / names[lam] for lam in (0.90, 0.95) for t in ("humaneval", "mbpp")]
    from vskip.commands import build_parser

    a = build_parser().parse_args(["calibrate-online", "finished", str(p), str(tmp_path / "nothing")])
    with pytest.raises(ValueError, match="no threshold has finished"):
        a.fn(a)


@pytest.mark.parametrize("study,runs_dir,thresholds", [("online", "runs/online", 5), ("online-256", "runs/online-256", 8)])
def test_the_committed_online_reports_were_made_from_the_finished_thresholds(tmp_path, monkeypatch, study, runs_dir,
                                                                              thresholds):
    """Each committed online study: at 128 tokens (its grid stopped at 0.75 for time), and at 256
    with A, R, MNT, BATCH set (the whole grid)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    there = ROOT / "docs" / "results" / study
    with tarfile.open(there / "cal-report" / "runs.tar.xz", "r:xz") as tar:
        for name in tar.getnames():
            if name.endswith("/summary.json"):
                (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / name).write_text("{}")
    runs = online.finished(Path(f"docs/results/{study}/predictor"), Path(f"{runs_dir}/cal"))
    assert len(runs) == 2 * thresholds and thresholds <= len(grid("online-cal"))  # both tasks
    want = shlex.join(["vskip", "report", *map(str, runs), "--archive", "--out", f"docs/results/{study}/cal-report"])
    assert want == _made_by(there / "cal-report" / "report.md")
    rec = json.loads((there / "predictor" / "prefix" / "online.json").read_text())
    assert rec["runs"] == list(map(str, runs))  # and `choose` read the same runs, in the same order


# ----------------------------------------------------------------------------- the scripts


def test_the_scripts_find_vskip_one_way_and_hold_no_python():
    scripts = sorted((ROOT / "scripts").glob("*.sh"))
    # a script runs vskip when it names $VSKIP (VSKIP_CACHE, an environment variable of vskip's, is not it)
    runs_vskip = [p for p in scripts if re.search(r"\bVSKIP\b(?!_)", p.read_text()) and p.name != "setup.sh"]
    assert {p.name for p in runs_vskip} >= {"fullscale.sh", "online.sh", "conditioned.sh", "drafter_v2.sh",
                                             "paper_plans.sh", "gpu_check.sh", "sampling.sh"}
    for p in runs_vskip:
        text = p.read_text()
        assert text.count("VSKIP=${VSKIP:-.venv/bin/vskip}\n") == 1, p.name
        assert not any(s in text for s in ("<<", "python3", "python -c", ".venv/bin/python")), p.name


def _stub_calls(where, script: str, *args: str, **env_vars: str) -> list[str]:
    """The vskip command lines SCRIPT runs (each a line of its arguments, in sorted order: some run
    side by side), with a stub vskip in the new directory WHERE that only records them."""
    import os
    import subprocess

    where.mkdir()
    log = where / "calls"
    stub = where / "vskip"
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    stub.chmod(0o755)
    knobs = ("R", "S", "A", "MNT", "BATCH", "B", "PARTS", "UNTIL", "GRID", "ROUND", "KEY", "NOCACHE_KEY", "ONLY", "NOCACHE_TASKS")
    env = {k: v for k, v in os.environ.items() if k not in knobs}
    env.update(VSKIP=str(stub), **env_vars)
    p = subprocess.run(["bash", str(ROOT / "scripts" / script), *args], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return sorted(log.read_text().splitlines()) if log.exists() else []


def test_fullscale_sh_hands_its_knobs_to_vskip_fullscale(tmp_path):
    calls = _stub_calls(tmp_path / "f", "fullscale.sh", "sweep", "--limit", "mbpp=20", ONLY="mbpp", UNTIL="08:40",
                        NOCACHE_TASKS="humaneval mbpp", R="r")
    assert calls == ["fullscale sweep --limit mbpp=20 --runs r --only mbpp --until 08:40 --nocache-tasks humaneval,mbpp"]


def test_sampling_sh_runs_the_rest_of_the_protocol_batched(tmp_path):
    calls = _stub_calls(tmp_path / "t", "sampling.sh", "temps", R="r")
    assert len(calls) == 4  # two temperatures, two shards each
    for T in ("0.2", "1.0"):
        for i in (1, 2):
            assert (f"compare --preset study --task humaneval --seed 0 --threads 1 --quiet --configs ar,strict,raw "
                    f"--temperature {T} --batch-size 8 --shard {i}/2 --out r/he164-T{T}") in calls
    calls = _stub_calls(tmp_path / "p", "sampling.sh", "passk", R="r", B="4", PARTS="3",
                        S=str(tmp_path / "none"))
    assert len(calls) == 6  # two policies, three parts each
    for p in ("ar", "strict-spec"):
        for i in (1, 2, 3):
            c = next(c for c in calls if c.endswith(f" --out r/passk/{p}-T0.6-n10/part-{i}of3"))
            assert "--temperature 0.6 --samples-per-prompt 10 --batch-size 10" in c
            assert ("--speculative-sampling" in c) == (p == "strict-spec")
            ids = c.split(" --ids ")[1].split(" ")[0].split(",")
            assert ids == [f"HumanEval/{j}" for j in range(i - 1, 164, 3)]  # prompts I, I+3, ... of the 164


def test_sampling_sh_passk_skips_the_parts_already_packed(tmp_path):
    (tmp_path / "s" / "passk" / "ar-T0.6-n10" / "part-2of2").mkdir(parents=True)
    (tmp_path / "s" / "passk" / "ar-T0.6-n10" / "part-2of2" / "samples.jsonl.gz").write_bytes(b"")
    calls = _stub_calls(tmp_path / "p", "sampling.sh", "passk", R="r", S=str(tmp_path / "s"), PARTS="2")
    assert [c.split(" --out ")[1] for c in calls] == [
        "r/passk/ar-T0.6-n10/part-1of2", "r/passk/strict-spec-T0.6-n10/part-1of2",
        "r/passk/strict-spec-T0.6-n10/part-2of2"]


def test_sampling_sh_packs_the_parts_and_scores_them_as_one(tmp_path, monkeypatch):
    """pack keeps each finished part in S and, once all are there, scores them as one, the standard
    rule's paired with ar's score."""
    monkeypatch.chdir(tmp_path)
    r, s = tmp_path / "r" / "passk", tmp_path / "s" / "passk"
    for name in ("ar-T0.6-n10", "strict-spec-T0.6-n10"):
        for i in (1, 2):
            d = r / name / f"part-{i}of2"
            d.mkdir(parents=True)
            if name == "strict-spec-T0.6-n10" and i == 2:
                continue  # in flight: no summary yet
            (d / "summary.json").write_text("{}")
            (d / "samples.jsonl").write_text("{}\n" * 820)  # 82 prompts x 10
    (r / "ar-T0.6-n10" / "part-1of2" / "samples.jsonl").write_text("{}\n" * 819)  # one short: a summary ...
    calls = _stub_calls(tmp_path / "k0", "sampling.sh", "pack", R=str(tmp_path / "r"), S=str(tmp_path / "s"),
                        PARTS="2")
    assert calls == [] and not (s / "ar-T0.6-n10" / "part-1of2").exists()  # ... is not enough to keep it
    (r / "ar-T0.6-n10" / "part-1of2" / "samples.jsonl").write_text("{}\n" * 820)
    knobs = dict(R=str(tmp_path / "r"), S=str(tmp_path / "s"), PARTS="2")
    calls = _stub_calls(tmp_path / "k", "sampling.sh", "pack", **knobs)
    a = f"{s}/ar-T0.6-n10"
    assert calls == [f"score --task humaneval --samples {a}/part-1of2/samples.jsonl.gz {a}/part-2of2/samples.jsonl.gz "
                     f"--out {a}/score.json"]  # the standard rule has one part of two: not scored
    assert (s / "strict-spec-T0.6-n10" / "part-1of2" / "samples.jsonl.gz").is_file()
    assert (s / "strict-spec-T0.6-n10" / "part-1of2" / "summary.json").is_file()
    (r / "strict-spec-T0.6-n10" / "part-2of2" / "summary.json").write_text("{}")  # it finished
    (r / "strict-spec-T0.6-n10" / "part-2of2" / "samples.jsonl").write_text("{}\n" * 820)
    (s / "ar-T0.6-n10" / "score.json").write_text("{}")  # what the stub did not write
    shutil.rmtree(r / "ar-T0.6-n10")  # a later sitting: ar's parts are only in S now
    calls = _stub_calls(tmp_path / "k2", "sampling.sh", "pack", **knobs)
    t = f"{s}/strict-spec-T0.6-n10"
    assert calls == sorted([
        f"score --task humaneval --samples {a}/part-1of2/samples.jsonl.gz {a}/part-2of2/samples.jsonl.gz "
        f"--out {a}/score.json",
        f"score --task humaneval --samples {t}/part-1of2/samples.jsonl.gz {t}/part-2of2/samples.jsonl.gz "
        f"--out {t}/score.json --paired-with {a}/score.json"])


def test_sampling_sh_starts_nothing_after_until(tmp_path):
    import datetime

    now = datetime.datetime.now()
    past = (now - datetime.timedelta(minutes=2)).strftime("%Y-%m-%d %H:%M")
    later = (now + datetime.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M")
    assert _stub_calls(tmp_path / "p", "sampling.sh", "passk", UNTIL=past) == []  # past: nothing starts ...
    assert len(_stub_calls(tmp_path / "l", "sampling.sh", "passk", UNTIL=later, PARTS="2",
                                   S=str(tmp_path / "none"))) == 4
    import subprocess

    bad = subprocess.run(["bash", str(ROOT / "scripts" / "sampling.sh"), "passk"], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "UNTIL": "25:99", "VSKIP": "false"}, timeout=60)
    assert bad.returncode == 2  # ... nor with a time that is none


def test_online_sh_hands_its_budget_and_batch_to_the_sweeps(tmp_path):
    calls = _stub_calls(tmp_path / "c", "online.sh", "cal", A="a", R="r", MNT="256", BATCH="8")
    assert calls == ["calibrate-online sweep cal a/predictor --out r/cal --max-new-tokens 256 --batch-size 8"]
    calls = _stub_calls(tmp_path / "d", "online.sh", "test")
    assert calls == ["calibrate-online sweep test docs/results/online/predictor --out runs/online/test "
                     "--max-new-tokens 128 --batch-size 1"]
