"""Sweeps: grids, run directory names, sharding and merging, resume after a kill, worker
processes and Ray, all on the fake drafter/verifier pair (no model, no scoring)."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakes import FakeDrafter, FakeVerifier

from vskip.engine.decode import DecodeConfig
from vskip.engine.models.config import ModelConfig
from vskip.engine.policy import LEARNED
from vskip.study import grids, sweep

TIMING = {"decode_seconds", "draft_seconds", "verify_seconds", "predict_seconds", "shadow_seconds",
          "tokens_per_s", "policy_seconds", "policy_share", "c_D", "c_V",
          "machine", "machines"}  # where the clocks were read: a process of other threads is another machine
IDS = ("HumanEval/0", "HumanEval/1", "HumanEval/2", "HumanEval/3", "HumanEval/4")


class FakeTokenizer:
    """Six ids per prompt (the fake verifier ends sequences near 40 tokens)."""

    def __call__(self, text):
        return {"input_ids": [2 + b % 48 for b in hashlib.sha256(text.encode()).digest()[:6]]}

    def decode(self, tokens, skip_special_tokens=True):
        return " ".join(map(str, tokens))


def fake_pair(models, need_drafter):
    from vskip.engine.models.load import ModelPair

    return ModelPair(FakeDrafter(error=0.15) if need_drafter else None, FakeVerifier(), FakeTokenizer(),
                     {"verifier": "fake", "drafter": "fake"})


class _Crash(RuntimeError):
    pass


class CrashingTokenizer(FakeTokenizer):
    """Fails while finishing the ``n``-th prompt of the process: a kill with that prompt in flight."""

    budget = [0]

    def decode(self, tokens, skip_special_tokens=True):
        self.budget[0] -= 1
        if self.budget[0] < 0:
            raise _Crash("killed")
        return super().decode(tokens)


def crashing_pair(models, need_drafter):
    pair = fake_pair(models, need_drafter)
    pair.tokenizer = CrashingTokenizer()
    return pair


class SlowDrafter(FakeDrafter):
    def propose(self, seq, gamma, features=False, sampling=None, slot=0):
        time.sleep(0.01)
        return super().propose(seq, gamma, features)


def slow_pair(models, need_drafter):
    pair = fake_pair(models, need_drafter)
    pair.drafter = SlowDrafter(error=0.15) if need_drafter else None
    return pair


def make_plan(grid="cpu-small", shards=1, ids=IDS, **kw):
    decode = DecodeConfig(gamma=8, max_new_tokens=24, task="humaneval")
    return sweep.plan("humaneval", grid, decode, ModelConfig(), ids=ids, score=False, shards=shards, **kw)


def read_dir(d: Path) -> dict:
    """A run directory without its timings."""
    rows = lambda f: [json.loads(l) for l in (d / f).read_text().splitlines() if l.strip()]
    strip = lambda x: {k: v for k, v in x.items() if k not in TIMING}
    return {
        "samples": [strip(s) for s in rows("samples.jsonl")],
        "rounds": rows("rounds.jsonl"),
        "summary": strip(json.loads((d / "summary.json").read_text())),
        "run": json.loads((d / "config.json").read_text())["run"],
    }


def assert_same_sweep(a: Path, b: Path, names):
    for name in names:
        assert read_dir(a / name) == read_dir(b / name), name


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory):
    out = tmp_path_factory.mktemp("unbroken")
    p = make_plan()
    summaries = sweep.run_sweep(p, out, pair_factory=fake_pair, progress=False)
    return out, p, summaries


# --------------------------------------------------------------------------- grids and names


def test_table5_grid_is_the_paper():
    pts = grids.grid("table5")
    by = lambda m: [pt.policy for pt in pts if pt.policy.name == m]
    assert [p.lenience for p in by("lenience")] == [1.0, 0.99, 0.975, 0.95, 0.90, 0.80, 0.70, 0.50, 0.30]
    assert [p.top_k for p in by("topk")] == [2, 3, 5]
    raw = {(p.eta_b, p.eta_c) for p in by("raw")}
    assert len(raw) == 18 and (0.95, 0.995) in raw and (0.60, 0.50) in raw and (0.80, 0.85) in raw
    assert [p.eta_b for p in by("marginal")] == [0.85, 0.90, 0.93, 0.95, 0.97, 0.98, 0.99]
    assert all(p.eta_b == p.eta_c for p in by("marginal"))
    assert [p.eta_c for p in by("conditional")] == [0.99, 0.98, 0.97, 0.95, 0.93, 0.90, 0.85, 0.80]
    assert all(p.k_min == 6 and p.s_max == 64 for m in LEARNED + ("raw",) for p in by(m))
    assert len(by("strict")) == 1 and len(pts) == 46


def test_kmin_gates_periodic_grids():
    kmin = grids.grid("kmin")
    assert [p.policy.k_min for p in kmin if p.policy.name == "raw"] == [0, 3, 6, 9, 12, 16, 24, 32]
    assert all((p.policy.eta_b, p.policy.eta_c) == (0.90, 0.93) for p in kmin if p.policy.name == "raw")
    gates = {pt.name: pt.role for pt in grids.grid("gates")}
    assert gates["raw_eb0.90_ec0.00_k6_s64"] == "gate:local-only"
    assert gates["raw_eb0.00_ec0.93_k6_s64"] == "gate:geometric-only"
    assert gates["conditional_eb0.00_ec0.90_k6_s64"] == "gate:product-only"
    assert [p.policy.period for p in grids.grid("periodic") if p.policy.name == "periodic"] == [3, 4, 8]
    assert {pt.name for pt in grids.grid("cpu-small")} >= {"ar", "strict", "topk_k2", "periodic_P4_K6_s64"}
    signals = grids.grid("cpu-signals")
    assert [sum(p.policy.name == n for p in signals) for n in ("strict", "raw", "marginal", "conditional")] == [1, 3, 3, 3]
    assert all(p.policy.k_min == 3 for p in signals if p.policy.name != "strict")
    with pytest.raises(ValueError, match="unknown grid"):
        grids.grid("nope")


def _part(pt) -> str:
    """What a point of the full grid is there for (docs/results/full.md), read from its policy."""
    p = pt.policy
    if p.name == "prefix":
        if p.survival != "model":
            return "product"
        return "promise" if p.alpha <= 0.05 else "loose promise"
    if p.name == "raw":
        return "raw at k_min 3" if p.k_min == 3 else "raw at another k_min"
    return p.name


def test_the_full_grid_is_the_two_cpu_grids_with_what_the_verdicts_need_first():
    """A sweep runs its grid in order, so a sweep stopped early holds what the verdicts read first:
    Strict SDD, the promise at the risks asked for (tightest first), raw confidence (the CPU grid's
    settings, then the two tight ones), the conditional and marginal signals, raw at the other
    k_min, the two loosest risks, and last the confidence product. Each part is one run of points."""
    import itertools

    pts = grids.grid("full")
    full = [pt.name for pt in pts]
    both = {pt.name for g in ("cpu-signals", "prefix") for pt in grids.grid(g)}
    kmin = ["raw_eb0.70_ec0.70_k0_s64", "raw_eb0.70_ec0.70_k6_s64"]
    tight = ["raw_eb0.90_ec0.93_k3_s64", "raw_eb0.95_ec0.97_k3_s64"]
    # conditional survival's tightest point is the paper's fixed setting (Table 4) instead of the CPU grid's
    both = (both - {"conditional_eb0.70_ec0.90_k3_s64"}) | {"conditional_eb0.90_ec0.90_k3_s64"}
    assert sorted(full) == sorted(both | set(kmin) | set(tight)) and len(full) == len(set(full))
    parts = [_part(pt) for pt in pts]
    assert [part for part, _ in itertools.groupby(parts)] == [
        "strict", "promise", "raw at k_min 3", "conditional", "marginal", "raw at another k_min", "loose promise",
        "product"]
    of = lambda part: [pt for pt in pts if _part(pt) == part]  # noqa: E731
    assert [pt.policy.alpha for pt in of("promise")] == [0.01, 0.02, 0.05]
    assert [pt.policy.alpha for pt in of("loose promise")] == [0.10, 0.20]
    cpu_raw = [pt.name for pt in grids.grid("cpu-signals") if pt.policy.name == "raw"]
    assert [pt.name for pt in of("raw at k_min 3")] == cpu_raw + tight
    assert [pt.name for pt in of("raw at another k_min")] == kmin
    # an on-policy round sweeps the promise again under the same names, which its report pairs with round 0,
    # the largest alpha first
    assert [pt.name for pt in grids.grid("promise")] == [pt.name for pt in reversed(of("promise"))]


def test_config_names():
    from vskip.engine.policy import PolicyConfig

    assert grids.config_name(PolicyConfig.make("raw", eta_b=0.9, eta_c=0.93)) == "raw_eb0.90_ec0.93_k6_s64"
    assert grids.config_name(PolicyConfig.make("raw", eta_b=0.95, eta_c=0.995, k_min=0)) == "raw_eb0.95_ec0.995_k0_s64"
    assert grids.config_name(PolicyConfig.make("marginal", eta_m=0.97)) == "marginal_em0.97_k6_s64"
    assert grids.config_name(PolicyConfig.make("conditional", epsilon=0.1)) == "conditional_eb0.90_ec0.90_k6_s64"
    assert grids.config_name(PolicyConfig.make("lenience", lenience=0.975)) == "lenience_l0.975"
    assert grids.config_name(PolicyConfig.make("periodic", period=8)) == "periodic_P8_K6_s64"


def test_learned_signals_need_a_predictor():
    p = make_plan("transfer")
    assert set(p.configs) == {"strict", "raw_eb0.90_ec0.93_k6_s64"}
    assert {n for n, _ in p.skipped} == {"marginal_em0.90_k6_s64", "conditional_eb0.90_ec0.90_k6_s64"}
    q = make_plan("transfer", predictor="/some/dir")
    assert len(q.configs) == 4 and not q.skipped
    assert q.configs["raw_eb0.90_ec0.93_k6_s64"].predictor is None
    assert q.configs["marginal_em0.90_k6_s64"].predictor == "/some/dir"


def test_shards_cut_the_selection_in_order():
    p = make_plan(shards=3)
    assert p.shard_ids() == [IDS[0:2], IDS[2:3], IDS[3:5]]
    assert make_plan(shards=9).shards == len(IDS)


# --------------------------------------------------------------------------- running


def test_sweep_writes_run_dirs_and_record(unbroken):
    out, p, summaries = unbroken
    assert set(summaries) == set(p.configs)
    rec = json.loads((out / "sweep.json").read_text())
    assert rec["task"] == "humaneval" and rec["grid"] == "cpu-small" and rec["selection"] == list(IDS)
    assert [c["name"] for c in rec["configs"]] == list(p.configs)
    for name, s in summaries.items():
        assert s["n_prompts"] == len(IDS)
        assert [x["task_id"] for x in read_dir(out / name)["samples"]] == list(IDS)
    assert summaries["strict"]["strict_token"] == 1.0
    assert summaries["ar"]["calls_per_token"] == 1.0
    assert summaries["raw_eb0.60_ec0.50_k6_s64"]["skipped_rounds"] > 0  # the fakes do skip
    # the ar run was given the pair without its drafter
    assert "drafter" not in json.loads((out / "ar" / "config.json").read_text())["models"]


def test_shards_merge_to_a_single_run(unbroken, tmp_path):
    out, p, _ = unbroken
    q = make_plan(shards=2)
    sweep.run_sweep(q, tmp_path, pair_factory=fake_pair, progress=False)
    assert not (tmp_path / sweep.SHARDS).exists()
    assert_same_sweep(out, tmp_path, p.configs)


def test_rerun_of_a_finished_sweep_does_nothing(unbroken):
    out, p, summaries = unbroken

    def no_models(models, need_drafter):
        raise AssertionError("a finished sweep must not load models")

    assert sweep.run_sweep(p, out, pair_factory=no_models, progress=False) == summaries


def test_two_sweeps_on_one_directory_share_its_configurations(unbroken, tmp_path, capsys):
    """A configuration another process is writing is left to it, not counted as a failure: a second
    sweep started on the same directory takes the configurations nobody holds."""
    from vskip.files import DirLock

    out, p, _ = unbroken
    held = "raw_eb0.60_ec0.50_k6_s64"
    with DirLock(tmp_path / held, "run directory"):  # the other sweep, busy with this configuration
        summaries = sweep.run_sweep(p, tmp_path, pair_factory=fake_pair, progress=False)
    assert set(summaries) == set(p.configs) - {held}
    assert not (tmp_path / held / "samples.jsonl").exists()
    assert f"{held}[0] is being run by another process" in capsys.readouterr().err
    sweep.run_sweep(p, tmp_path, pair_factory=fake_pair, progress=False)  # the lock gone, it is run
    assert_same_sweep(out, tmp_path, p.configs)


@pytest.mark.parametrize("shards,kill_at", [(1, 13)] + [(2, k) for k in (0, 1, 4, 9, 13, 18, 24, 31, 38, 45, 49)])
def test_resume_after_a_crash_equals_an_unbroken_sweep(unbroken, tmp_path, shards, kill_at):
    out, p, _ = unbroken
    q = make_plan(shards=shards)
    CrashingTokenizer.budget[0] = kill_at  # dies while finishing prompt kill_at + 1 of 50
    with pytest.raises(ValueError, match="units failed"):
        sweep.run_sweep(q, tmp_path, pair_factory=crashing_pair, progress=False)
    done = sum(len(read_samples) for read_samples in _samples_written(tmp_path))
    assert done == kill_at  # nothing after the crash was lost except the prompt in flight
    sweep.run_sweep(q, tmp_path, pair_factory=fake_pair, progress=False)
    assert_same_sweep(out, tmp_path, p.configs)


def test_a_sweep_resumes_elsewhere_from_its_report_archive(unbroken, tmp_path, monkeypatch):
    """What a commit keeps of an unfinished sweep (the report's runs.tar.xz) is enough for a fresh
    clone to finish it with the same results."""
    import tarfile

    from vskip import report
    from vskip.report.build import archive_runs

    out, p, _ = unbroken
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    monkeypatch.chdir(here)
    CrashingTokenizer.budget[0] = 13
    with pytest.raises(ValueError, match="units failed"):
        sweep.run_sweep(make_plan(), Path("sw"), pair_factory=crashing_pair, progress=False)
    rep = report.build_report([Path("sw")], Path("rep"), n_boot=50, warn=lambda m: None)
    archive_runs(rep, Path("rep") / "runs.tar.xz")
    with tarfile.open(here / "rep" / "runs.tar.xz") as tar:
        names = tar.getnames()
        assert "sw/sweep.json" in names and not any(n.startswith("/") for n in names)
        tar.extractall(there, filter="data")
    monkeypatch.chdir(there)
    assert sum(map(len, _samples_written(Path("sw")))) == 13
    sweep.run_sweep(make_plan(), Path("sw"), pair_factory=fake_pair, progress=False)
    assert_same_sweep(out, there / "sw", p.configs)


def _samples_written(root: Path):
    for f in root.rglob("samples.jsonl"):
        yield [l for l in f.read_text().splitlines() if l.strip()]


def _start_sweep(out: Path, workers: int) -> subprocess.Popen:
    """A slow two-shard sweep in a process (and session) of its own, writing to ``out``."""
    script = (
        "import sys; sys.path.insert(0, %r); sys.path.insert(0, %r)\n"
        "import test_sweep as t\n"
        "from vskip.study import sweep\n"
        "sweep.run_sweep(t.make_plan(shards=2), %r, workers=%d, pair_factory=t.slow_pair, progress=False)\n"
    ) % (str(Path(__file__).parent), str(Path(__file__).parent.parent), str(out), workers)
    return subprocess.Popen([sys.executable, "-c", script], start_new_session=True)


def test_resume_after_sigkill_equals_an_unbroken_sweep(unbroken, tmp_path):
    out, p, _ = unbroken
    proc = _start_sweep(tmp_path, workers=1)
    try:
        deadline = time.time() + 60
        while sum(len(s) for s in _samples_written(tmp_path)) < 8:
            assert proc.poll() is None, "the sweep ended before it could be killed"
            assert time.time() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert not all((tmp_path / n / "summary.json").exists() for n in p.configs)
    sweep.run_sweep(make_plan(shards=2), tmp_path, pair_factory=fake_pair, progress=False)
    assert_same_sweep(out, tmp_path, p.configs)


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_workers_end_when_their_sweep_is_killed(tmp_path):
    """A sweep killed outright takes its workers with it: they do not go on with the queued units."""
    proc = _start_sweep(tmp_path, workers=2)
    workers = []
    try:
        deadline = time.time() + 120
        while sum(len(s) for s in _samples_written(tmp_path)) < 2:
            assert proc.poll() is None, "the sweep ended before it could be killed"
            assert time.time() < deadline
            time.sleep(0.05)
        workers = [c for c in _children(proc.pid) if _alive(c)]
        os.kill(proc.pid, signal.SIGKILL)  # the sweep alone, not its process group
        proc.wait()
        deadline = time.time() + 15
        while any(_alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert workers and not any(_alive(w) for w in workers)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_worker_processes_give_the_same_results(unbroken, tmp_path):
    out, p, _ = unbroken
    q = make_plan(shards=2)
    sweep.run_sweep(q, tmp_path, workers=2, pair_factory=fake_pair, progress=False)
    assert_same_sweep(out, tmp_path, p.configs)


def test_a_different_sweep_in_the_same_directory_is_refused(unbroken, tmp_path):
    sweep.run_sweep(make_plan("periodic"), tmp_path, pair_factory=fake_pair, progress=False)
    with pytest.raises(ValueError, match="another task or prompt selection"):
        sweep.run_sweep(make_plan("periodic", ids=IDS[:2]), tmp_path, pair_factory=fake_pair, progress=False)
    decode = DecodeConfig(gamma=4, max_new_tokens=24, task="humaneval")
    other = sweep.plan("humaneval", "periodic", decode, ModelConfig(), ids=IDS, score=False)
    with pytest.raises(ValueError, match="other settings"):
        sweep.run_sweep(other, tmp_path, pair_factory=fake_pair, progress=False)
    # another grid with the same settings shares the directory and its finished runs
    sweep.run_sweep(make_plan("kmin"), tmp_path, pair_factory=fake_pair, progress=False)
    rec = json.loads((tmp_path / "sweep.json").read_text())
    assert rec["grids"] == ["periodic", "kmin"] and len(rec["configs"]) == 4 + 8


def test_ray_executor(unbroken, tmp_path):
    ray = pytest.importorskip("ray")
    out, p, _ = unbroken
    here = str(Path(__file__).parent)
    path = os.pathsep.join([here, str(Path(here).parent), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=1, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        sweep.run_sweep(make_plan(shards=2), tmp_path, workers=1, executor="ray", pair_factory=fake_pair,
                        progress=False)
    finally:
        ray.shutdown()
    assert_same_sweep(out, tmp_path, p.configs)


# --------------------------------------------------------------------------- command line


def parser():
    from vskip.cli import build_parser

    return build_parser()


def test_cli_lists_a_grid(capsys):
    a = parser().parse_args(["sweep", "--grid", "gates", "--list"])
    assert a.fn(a) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 7 and "needs --predictor" in lines[-1]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--grid", "nope", "--task", "humaneval", "--out", "x"], "unknown grid"),
        (["--grid", "kmin", "--out", "x"], "--task and --out"),  # an unknown task: the parser refuses (test_cli)
        (["--grid", "kmin", "--task", "humaneval", "--out", "x", "--limit", "0"], "--limit"),
        (["--grid", "kmin", "--task", "humaneval", "--out", "x", "--ids", "HumanEval/999"], "999"),
    ],
)
def test_cli_bad_input(args, needle, tmp_path):
    a = parser().parse_args(["sweep", *[str(tmp_path / "o") if x == "x" else x for x in args]])
    with pytest.raises(ValueError, match=needle.replace("-", r"\-")) as e:
        a.fn(a)
    assert "\n" not in str(e.value)


def test_cli_help():
    res = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'vskip'; import test_sweep as t; "
                          "t.parser().parse_args(['sweep', '--help'])"],
                         capture_output=True, text=True, cwd=Path(__file__).parent)
    assert res.returncode == 0 and "--grid" in res.stdout and "--executor" in res.stdout


def test_ray_missing_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails
    with pytest.raises(ValueError, match="needs the ray package"):
        sweep.run_sweep(make_plan("periodic"), tmp_path / "s", executor="ray", pair_factory=fake_pair, progress=False)
    assert not (tmp_path / "s").exists()


# --------------------------------------------------------------------------- --batch-size


class _SlotsVerifier(FakeVerifier):
    """Notes the slots each loop opens (its batch size)."""

    slots: list = []

    def open_slots(self, n):
        self.slots.append(n)


def slots_pair(models, need_drafter):
    pair = fake_pair(models, need_drafter)
    pair.verifier = _SlotsVerifier()
    return pair


class _LoggedSlotsVerifier(FakeVerifier):
    """Appends the slots each loop opens to the file $SLOTS_LOG (from any worker process)."""

    def open_slots(self, n):
        with open(os.environ["SLOTS_LOG"], "a") as f:
            f.write(f"{os.getpid()} {n}\n")


def logged_slots_pair(models, need_drafter):
    pair = fake_pair(models, need_drafter)
    pair.verifier = _LoggedSlotsVerifier()
    return pair


def _without_batch(d: Path) -> dict:
    """A run directory without its timings, its samples and rounds in prompt order (a batch finishes
    them out of order), and its recorded batch size apart."""
    r = read_dir(d)
    batch = r["run"].pop("batch_size")
    r["samples"].sort(key=lambda s: s["task_id"])
    r["rounds"].sort(key=lambda x: (x["task_id"], x["round"]))
    return {**r, "batch_size": batch}


@pytest.mark.parametrize("batch", [2, 3])
def test_cli_batch_size_decodes_side_by_side_and_gives_batch_ones_runs(tmp_path, monkeypatch, batch):
    """`vskip sweep --batch-size B` on the fake pair: every configuration's run decodes B prompts side
    by side and writes what batch 1 writes, with the batch size in its config.json and in the
    sweep's record of each configuration; a bad value is refused by the parser."""
    monkeypatch.setattr(sweep, "load_models", slots_pair)
    monkeypatch.setattr(_SlotsVerifier, "slots", [])
    from vskip.cli import main

    def run(out, b):
        assert main(["sweep", "--task", "humaneval", "--grid", "cpu-small", "--ids", ",".join(IDS), "--gamma", "8",
                     "--max-new-tokens", "24", "--no-score", "--quiet", "--out", str(out), "--batch-size", str(b)]) == 0
        return {n: _without_batch(out / n) for n in make_plan().configs}

    one = run(tmp_path / "one", 1)
    assert set(_SlotsVerifier.slots) == {1}
    _SlotsVerifier.slots.clear()
    many = run(tmp_path / "many", batch)
    assert set(_SlotsVerifier.slots) == {batch}
    assert {n: {**r, "batch_size": 1} for n, r in many.items()} == one
    assert {r["batch_size"] for r in many.values()} == {batch}
    rec = json.loads((tmp_path / "many" / "sweep.json").read_text())
    assert {c["run"]["batch_size"] for c in rec["configs"]} == {batch}
    for bad in ("0", "1025"):
        with pytest.raises(SystemExit) as e:
            parser().parse_args(["sweep", "--grid", "kmin", "--batch-size", bad])
        assert e.value.code == 2


def test_worker_processes_decode_at_the_plans_batch_size(unbroken, tmp_path, monkeypatch):
    """Two worker processes on two shards: each unit's run config carries the batch size to its
    worker, which decodes B prompts side by side and writes what one process at batch 1 writes."""
    out, p, _ = unbroken
    log = tmp_path / "slots.log"
    monkeypatch.setenv("SLOTS_LOG", str(log))
    q = make_plan(shards=2, batch_size=2)
    assert {c.batch_size for c in q.configs.values()} == {u.cfg.batch_size for u in q.units(tmp_path)} == {2}
    sweep.run_sweep(q, tmp_path / "s", workers=2, pair_factory=logged_slots_pair, progress=False)
    seen = [line.split() for line in log.read_text().splitlines()]
    assert seen and {n for _, n in seen} == {"2"} and str(os.getpid()) not in {pid for pid, _ in seen}  # in workers
    tmp_path = tmp_path / "s"
    for name in p.configs:
        a, b = _without_batch(out / name), _without_batch(tmp_path / name)
        assert (a.pop("batch_size"), b.pop("batch_size")) == (1, 2)
        assert a == b, name
