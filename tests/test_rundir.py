"""A run directory that cannot be corrupted: one writer at a time, a resume that neither loses a
prompt nor counts one twice, whatever line a kill cut, and errors that name the damaged file. All
on the fake pair (no model, no scoring)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_sweep import IDS, fake_pair, read_dir

from vskip.engine.decode import DecodeConfig
from vskip.engine.models.config import ModelConfig
from vskip.engine.policy import PolicyConfig, Sampling
from vskip.files import DirLock, FileError, read_json, read_jsonl, write_atomic
from vskip.study import runner
from vskip.study.runner import RunConfig


def _cfg(policy="strict", n=1):
    sampling = Sampling(temperature=0.9, top_p=0.95, seed=4) if n > 1 else Sampling()
    return RunConfig(task="humaneval", policy=PolicyConfig(name=policy),
                     decode=DecodeConfig(gamma=8, max_new_tokens=24, task="humaneval", sampling=sampling),
                     models=ModelConfig(), ids=IDS, score=False, samples_per_prompt=n)


def _run(out: Path, policy="strict", n=1):
    return runner.run(_cfg(policy, n), out, progress=False, pair=fake_pair(None, True))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    out = tmp_path_factory.mktemp("clean")
    _run(out)
    return read_dir(out)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_a_second_writer_on_one_run_directory_refuses(tmp_path, clean):
    with DirLock(tmp_path, "run directory"):
        with pytest.raises(FileError, match="another process is writing run directory"):
            _run(tmp_path)
    assert not (tmp_path / "samples.jsonl").exists()  # the refused run wrote nothing
    _run(tmp_path)  # the lock went with its holder
    assert read_dir(tmp_path) == clean


def test_a_cut_last_line_of_rounds_redoes_that_prompt_only(tmp_path, clean):
    _run(tmp_path)
    rounds = tmp_path / "rounds.jsonl"
    lines = _lines(rounds)
    rounds.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])  # kill mid-line
    _run(tmp_path)
    got = read_dir(tmp_path)
    assert got == clean
    # every prompt's rounds add up to what its sample recorded, none counted twice
    for s in got["samples"]:
        assert sum(r["task_id"] == s["task_id"] for r in got["rounds"]) == s["rounds"]


def test_a_cut_last_line_of_samples_redoes_that_prompt(tmp_path, clean):
    _run(tmp_path)
    samples = tmp_path / "samples.jsonl"
    lines = _lines(samples)
    samples.write_text("".join(lines[:-1]) + lines[-1][:10])
    _run(tmp_path)
    assert read_dir(tmp_path) == clean


def test_rounds_without_their_sample_are_dropped(tmp_path, clean):
    _run(tmp_path)
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(_lines(samples)[:-1]))  # killed between rounds and sample
    _run(tmp_path)
    assert read_dir(tmp_path) == clean


def test_rounds_are_written_once_and_a_resume_only_appends(tmp_path, clean):
    """rounds.jsonl is never rewritten: a resume truncates it after the last whole prompt and
    appends (the same file, its earlier bytes untouched), and the end of the run leaves it alone."""
    _run(tmp_path)
    rounds, samples = tmp_path / "rounds.jsonl", tmp_path / "samples.jsonl"
    kept = _lines(samples)[:-1]
    samples.write_text("".join(kept))  # killed between the last prompt's rounds and its sample
    n_whole = sum(json.loads(line)["rounds"] for line in kept)
    whole = "".join(_lines(rounds)[:n_whole]).encode()
    inode = rounds.stat().st_ino
    _run(tmp_path)
    assert rounds.stat().st_ino == inode and rounds.read_bytes().startswith(whole)
    assert read_dir(tmp_path) == clean


def test_a_sample_missing_some_of_its_rounds_is_redone(tmp_path, clean):
    _run(tmp_path)
    rounds = tmp_path / "rounds.jsonl"
    lines = _lines(rounds)
    rounds.write_text("".join(lines[1:]))  # the first prompt lost a round
    _run(tmp_path)
    assert read_dir(tmp_path) == clean


def test_a_foreign_line_in_samples_names_the_file_and_line(tmp_path):
    _run(tmp_path)
    samples = tmp_path / "samples.jsonl"
    samples.write_text("[1, 2]\n" + samples.read_text())
    with pytest.raises(FileError, match=r"samples.jsonl line 1 is not a JSON object"):
        _run(tmp_path)


def test_a_sample_without_task_id_names_the_file(tmp_path):
    _run(tmp_path)
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"completion": "x"}) + "\n" + samples.read_text())
    with pytest.raises(FileError, match=r"samples.jsonl: row 1 has no task_id"):
        _run(tmp_path)


def test_a_damaged_run_config_names_the_file(tmp_path):
    _run(tmp_path)
    (tmp_path / "config.json").write_text("{\n")
    with pytest.raises(FileError, match=r"run configuration .*config.json is not valid JSON"):
        _run(tmp_path)


def test_out_naming_a_file_refuses_before_any_work(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(FileError, match="is a file, not a directory"):
        _run(f)


def test_write_atomic_leaves_the_old_file_when_the_writer_fails(tmp_path):
    p = tmp_path / "a.json"
    write_atomic(p, "old")

    def fails(tmp):
        Path(tmp).write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(p, fails)
    assert p.read_text() == "old" and sorted(x.name for x in tmp_path.iterdir()) == ["a.json"]
    write_atomic(p, b"new")
    assert p.read_text() == "new"


def test_readers_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.json"):
        read_json(tmp_path / "nothing.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    with pytest.raises(FileError, match="bad.jsonl line 2"):
        read_jsonl(bad)
    bad.write_bytes(b"\xff\xfe\n")
    with pytest.raises(FileError, match="not UTF-8"):
        read_jsonl(bad)
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"a": 1}\n{"b": ')
    heard = []
    assert read_jsonl(cut, on_cut=heard.append) == [{"a": 1}] and heard


def test_a_partial_read_keeps_the_rows_before_a_bad_line_and_gzip_reads_alike(tmp_path):
    import gzip

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n[2]\n{"b": 3}\n')
    heard = []
    assert read_jsonl(bad, on_cut=heard.append, partial=True) == [{"a": 1}]
    assert heard == [f"{bad}: line 2 is cut or invalid; read the 1 lines before it"]
    with pytest.raises(FileError, match="line 2 is not a JSON object"):
        read_jsonl(bad)
    packed = tmp_path / "rows.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"a": 1}\n{"b": 2}\n'))
    assert read_jsonl(packed) == [{"a": 1}, {"b": 2}]
    packed.write_bytes(b"not gzip")
    with pytest.raises(FileError, match="not a readable gzip file"):
        read_jsonl(packed)


class _Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs, not even cleanup written as except Exception."""


@pytest.fixture(scope="module")
def clean_sampled(tmp_path_factory):
    out = tmp_path_factory.mktemp("sampled")
    _run(out, n=3)
    return read_dir(out)


def test_a_sampled_run_writes_each_prompts_samples_in_order_and_they_differ(clean_sampled):
    rows = clean_sampled["samples"]
    assert [(r["task_id"], r["sample"]) for r in rows] == [(t, i) for t in IDS for i in range(3)]
    for t in IDS:
        assert len({tuple(r["tokens"]) for r in rows if r["task_id"] == t}) > 1
        for i in range(3):  # each sample's rounds add up
            n = sum(r["task_id"] == t and r["sample"] == i for r in clean_sampled["rounds"])
            assert n == next(r["rounds"] for r in rows if (r["task_id"], r["sample"]) == (t, i))


def _dying_pair(kill_at: int):
    """The fake pair, whose drafter dies (as with SIGKILL) at its ``kill_at``-th block."""
    from fakes import FakeDrafter

    class Dies(FakeDrafter):
        calls = 0

        def propose(self, seq, gamma, features=False, sampling=None, slot=0):
            Dies.calls += 1
            if Dies.calls == kill_at:
                raise _Killed
            return super().propose(seq, gamma, features)

    pair = fake_pair(None, True)
    pair.drafter = Dies(error=0.15)
    return pair


@pytest.mark.parametrize("kill_at", [2, 7, 13, 20, 30])
def test_a_sampled_run_killed_resumes_to_the_same_tokens(tmp_path, clean_sampled, kill_at):
    pair = _dying_pair(kill_at)
    with pytest.raises(_Killed):
        runner.run(_cfg(n=3), tmp_path, progress=False, pair=pair)
    _run(tmp_path, n=3)
    assert read_dir(tmp_path) == clean_sampled


def test_samples_per_prompt_needs_sampling():
    with pytest.raises(ValueError, match="needs --temperature"):
        RunConfig(task="humaneval", policy=PolicyConfig(name="strict"), decode=DecodeConfig(gamma=8), samples_per_prompt=2)


@pytest.mark.parametrize("kill_at", [1, 2, 4, 6, 8, 10, 12, 15, 18, 21, 24])
def test_a_run_killed_at_any_point_resumes_to_the_same_files(tmp_path, clean, kill_at):
    pair = _dying_pair(kill_at)
    with pytest.raises(_Killed):
        runner.run(_cfg(), tmp_path, progress=False, pair=pair)
    assert not (tmp_path / "summary.json").exists()
    _run(tmp_path)
    assert read_dir(tmp_path) == clean


def test_the_command_line_is_recorded_and_shown_by_the_report(tmp_path):
    from vskip.study.rundir import load_run

    out = tmp_path / "r"
    runner.run(_cfg("strict"), out, progress=False, pair=fake_pair(None, True),
               command="vskip run --task humaneval --policy strict --out r")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["command"] == "vskip run --task humaneval --policy strict --out r"
    assert load_run(out).command() == cfg["command"]  # not rebuilt from the configuration


def test_every_sample_names_the_machine_its_clocks_were_read_on(tmp_path):
    """A run resumed elsewhere mixes machines; the report says so, and says when a run was timed
    on other machines than its Strict SDD reference."""
    from vskip import report
    from vskip.engine.runtime import machine_id
    from vskip.study.rundir import load_run

    strict, raw = tmp_path / "strict", tmp_path / "raw"
    runner.run(_cfg("strict"), strict, progress=False, pair=fake_pair(None, True))
    runner.run(_cfg("raw"), raw, progress=False, pair=fake_pair(None, True))
    host = json.loads((strict / "config.json").read_text())["machine"]
    assert host["cpu"] and host["cores"] >= 1 and isinstance(host["isa"], list)
    assert host["threads"] >= 1 and host["torch"] and host["transformers"]
    samples = read_jsonl(strict / "samples.jsonl")
    assert {s["machine"] for s in samples} == {machine_id(host)}
    assert json.loads((strict / "summary.json").read_text())["machines"] == [machine_id(host)]
    assert not [n for n in load_run(strict).notes if "machines" in n]
    # the raw run finished its last prompt on another machine
    rows = read_jsonl(raw / "samples.jsonl")
    rows[-1]["machine"] = "0123456789ab"
    (raw / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert any("timed on 2 machines" in n for n in load_run(raw).notes)
    rep = report.build_report([strict, raw], tmp_path / "rep", n_boot=50, warn=lambda m: None)
    assert any("raw: timed on other machines than its reference strict" in n for n in rep.notes)
    assert not any(n.startswith("strict: timed on") for n in rep.notes)


def test_a_machine_is_named_by_its_cpu_extensions_threads_and_versions():
    """The id rows and samples carry is a line a reader checks: the CPU model with its vector
    extensions (the three AMX flags as one AMX), threads, torch, transformers, GPUs; the ids an
    earlier vskip wrote (a hash of the record) are read back through the records they hash."""
    from vskip.engine.runtime import LEGACY_RECORDS, legacy_id, machine_id, machine_name

    info = {"cpu": "Intel(R) Xeon(R) Platinum", "cores": 2, "threads": 2, "torch": "2.13.0", "transformers": "5.24.0",
            "isa": ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"], "gpus": ["NVIDIA H200"]}
    assert machine_id(info) == ("Intel(R) Xeon(R) Platinum (AVX2, AVX512F, AVX512-BF16, AMX); 2 threads; "
                                "torch 2.13.0; transformers 5.24.0; GPU NVIDIA H200")
    assert machine_id({"cpu": "AMD EPYC", "isa": [], "threads": 1}) == "AMD EPYC (no AVX2); 1 thread"
    # the committed rows: the sampling runs on the AVX2 EPYC, the engine's on the AVX512F Xeon
    assert [legacy_id(r) for r in LEGACY_RECORDS] == ["fab443138af2", "4f1a4b53077f"]
    assert machine_name("fab443138af2") == "AMD EPYC (AVX2); 2 cores"
    assert machine_name("4f1a4b53077f") == "Intel(R) Xeon(R) Processor @ 2.60GHz (AVX2, AVX512F); 2 cores"
    assert machine_name("a line already") == "a line already" and machine_name(None) is None
