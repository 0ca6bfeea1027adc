"""Writes never leave an output directory through a link, never replace a device node or a FIFO,
never adopt files vskip did not write, and every directory writer takes a lock."""

from __future__ import annotations

import json
import os
import shlex

import pytest
from test_sweep import IDS, fake_pair

from vskip import cli
from vskip.engine.decode import DecodeConfig
from vskip.engine.models.config import ModelConfig
from vskip.engine.policy import PolicyConfig
from vskip.files import DirLock, FileError, check_writable_dir, open_append, save_figure, write_atomic, write_json
from vskip.study import runner
from vskip.study.runner import RunConfig


@pytest.fixture
def outside(tmp_path):
    """A file outside the output directory that a planted link points at."""
    f = tmp_path / "outside.txt"
    f.write_text("precious\n")
    return f


def test_the_write_probe_does_not_truncate_a_linked_file(tmp_path, outside):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".write-test").symlink_to(outside)
    check_writable_dir(out)
    assert outside.read_text() == "precious\n"


def test_a_linked_lock_file_is_refused_and_its_target_kept(tmp_path, outside):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".lock").symlink_to(outside)
    with pytest.raises(FileError, match="is a link"):
        with DirLock(out, "run directory"):
            pass
    assert outside.read_text() == "precious\n"
    missing = tmp_path / "not-yet"
    (out / ".lock").unlink()
    (out / ".lock").symlink_to(missing)  # a dangling link must not create its target either
    with pytest.raises(FileError, match="is a link"):
        with DirLock(out):
            pass
    assert not missing.exists()


def test_appends_refuse_links_and_replacements_replace_the_link(tmp_path, outside):
    out = tmp_path / "out"
    out.mkdir()
    (out / "samples.jsonl").symlink_to(outside)
    with pytest.raises(FileError, match="is a link"):
        open_append(out / "samples.jsonl")
    write_json(out / "summary.json", {"a": 1})
    (out / "config.json").symlink_to(outside)
    write_json(out / "config.json", {"b": 2})
    assert not (out / "config.json").is_symlink() and json.loads((out / "config.json").read_text()) == {"b": 2}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "fig.png").symlink_to(outside)
    fig = plt.figure()
    save_figure(fig, out / "fig.png")
    plt.close(fig)
    assert not (out / "fig.png").is_symlink() and (out / "fig.png").read_bytes()[:4] == b"\x89PNG"
    assert outside.read_text() == "precious\n"


def test_a_fifo_is_never_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileError, match="not a regular file"):
        write_atomic(fifo, "x")
    assert fifo.is_fifo()


def _cfg():
    return RunConfig(task="humaneval", policy=PolicyConfig(name="strict"),
                     decode=DecodeConfig(gamma=8, max_new_tokens=16, task="humaneval"), models=ModelConfig(), ids=IDS,
                     score=False)


def test_a_run_refuses_a_directory_of_someone_elses_samples(tmp_path):
    out = tmp_path / "theirs"
    out.mkdir()
    theirs = "".join(json.dumps({"task_id": f"HumanEval/{i}", "completion": "pass"}) + "\n" for i in range(4))
    (out / "samples.jsonl").write_text(theirs)
    with pytest.raises(FileError, match="no config.json of a vskip run"):
        runner.run(_cfg(), out, progress=False, pair=fake_pair(None, True))
    assert (out / "samples.jsonl").read_text() == theirs


def test_a_sweep_refuses_a_damaged_sweep_record(tmp_path):
    from vskip.study.sweep import plan, run_sweep

    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.json").write_text("{ not json")
    p = plan("humaneval", "cpu-small", DecodeConfig(gamma=8, max_new_tokens=16, task="humaneval"), ModelConfig(),
             ids=IDS, score=False)
    with pytest.raises(FileError, match="not a sweep record"):
        run_sweep(p, out, pair_factory=fake_pair, progress=False)
    assert (out / "sweep.json").read_text() == "{ not json"


def test_a_sweep_directory_has_one_writer(tmp_path):
    from vskip.study.sweep import plan, run_sweep

    out = tmp_path / "sweep"
    p = plan("humaneval", "cpu-small", DecodeConfig(gamma=8, max_new_tokens=16, task="humaneval"), ModelConfig(),
             ids=IDS, score=False)
    with DirLock(out, "sweep directory"):
        with pytest.raises(FileError, match="another process is writing sweep directory"):
            run_sweep(p, out, pair_factory=fake_pair, progress=False)
    assert not (out / "sweep.json").exists()


@pytest.mark.parametrize("argv, lock, words", [
    ("compare --task humaneval --limit 1 --configs ar,strict --out {out}", ".lock-shard-1-of-1", "shard 1/1"),
    ("compare --task humaneval --limit 3 --configs ar,strict --shard 2/3 --out {out}", ".lock-shard-2-of-3", "shard 2/3"),
    ("report {out}/runs --out {out}", ".lock", "report directory"),
])
def test_a_second_writer_is_refused_before_any_model_loads(argv, lock, words, tmp_path, capsys, monkeypatch):
    import vskip.engine.models.load as load

    def no_models(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(load, "load_pair", no_models)
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    with DirLock(out, "held", name=lock):
        rc = cli.main(shlex.split(argv.format(out=out)))
    err = capsys.readouterr().err
    assert rc != 0 and "another process is writing" in err and words in err, err


def test_shards_of_one_comparison_do_not_block_each_other(tmp_path):
    with DirLock(tmp_path, "a", name=".lock-shard-1-of-2"):
        with DirLock(tmp_path, "b", name=".lock-shard-2-of-2"):
            pass


def test_score_refuses_a_device_as_out_before_scoring(tmp_path, capsys):
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"task_id": "HumanEval/0", "completion": "pass"}) + "\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    rc = cli.main(["score", "--task", "humaneval", "--samples", str(samples), "--out", str(fifo)])
    assert rc == 2 and "not a regular file" in capsys.readouterr().err
    assert fifo.is_fifo()


def test_sandbox_directories_a_killed_scorer_left_are_removed(tmp_path, monkeypatch):
    import subprocess

    from vskip.bench.sandbox import run as sbx

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"vskip-sbx-{dead.pid}-abcd"
    live = tmp_path / f"vskip-sbx-{os.getppid()}-abcd"  # a live process's
    other = tmp_path / "vskip-sbx-notapid"
    for d in (stale, live, other):
        d.mkdir()
        (d / "prog.py").write_text("x")
    monkeypatch.setattr(sbx, "_cleaned", False)
    sbx._clean_stale_dirs()
    assert not stale.exists() and live.exists() and other.exists()


def test_pids_cgroups_a_killed_scorer_left_are_removed(tmp_path, monkeypatch):
    """As root, the rlimits-own-uid kind bounds processes with a pids cgroup per program; a cgroup
    whose scorer was killed is emptied and removed by the next scorer (here on a plain directory
    standing in for the cgroup parent)."""
    import subprocess

    from vskip.bench.sandbox import run as sbx

    parent = tmp_path / "cgroup"
    parent.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(sbx, "_is_root", lambda: True)
    monkeypatch.setattr(sbx, "_pids_cgroup_parent", lambda: str(parent))
    removed = []
    monkeypatch.setattr(sbx, "_remove_cgroup", removed.append)
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"vskip-sbx-{dead.pid}-abcd", f"vskip-sbx-{os.getppid()}-abcd", "user.slice"):
        (parent / name).mkdir()
    monkeypatch.setattr(sbx, "_cleaned", False)
    sbx._clean_stale_dirs()
    assert removed == [str(parent / f"vskip-sbx-{dead.pid}-abcd")]


def test_an_edited_benchmark_cache_is_not_trusted(tmp_path, monkeypatch, capsys):
    from vskip.bench import tasks

    monkeypatch.setattr(tasks, "_cache_root", lambda: tmp_path)
    monkeypatch.setattr(tasks, "_MEMO", {})
    first = tasks.load_task("humaneval", limit=1)[0]
    (cache,) = tmp_path.glob("humaneval-*.jsonl")
    text = cache.read_text()
    assert first.test in text.replace("\\n", "\n") or json.dumps(first.test)[1:-1] in text
    cache.write_text(text.replace(json.dumps(first.test)[1:-1], "def check(candidate):\\n    pass\\n"))
    monkeypatch.setattr(tasks, "_MEMO", {})
    again = tasks.load_task("humaneval", limit=1)[0]
    assert again.test == first.test
    assert "does not match its sha256" in capsys.readouterr().err


def test_a_damaged_safetensors_file_is_named(tmp_path):
    import shutil

    from vskip.engine.models.backbone import read_safetensors_dir, read_safetensors_file
    from vskip.engine.models.drafter_io import load_drafter_model
    from vskip.engine.models.embedded import embedded_drafter_dir

    bad = tmp_path / "d"
    bad.mkdir()
    shutil.copy(embedded_drafter_dir() / "drafter.json", bad / "drafter.json")
    (bad / "drafter.safetensors").write_bytes(b"\xff" * 64)  # a header length far past the file
    for call in (lambda: read_safetensors_file(bad / "drafter.safetensors"), lambda: read_safetensors_dir(bad),
                 lambda: load_drafter_model(bad)):
        with pytest.raises(ValueError, match=r"drafter.safetensors is not a readable safetensors file"):
            call()


def test_a_full_disk_names_the_file_it_could_not_write(tmp_path, monkeypatch, capsys):
    import errno

    from vskip.files import naming

    with pytest.raises(OSError) as e:
        with naming(tmp_path / "summary.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert e.value.filename == str(tmp_path / "summary.json") and e.value.errno == errno.ENOSPC
    from vskip.cli import describe

    assert describe(e.value) == f"No space left on device: {tmp_path / 'summary.json'}"
    real_open = open

    def full(path, mode="r", *a, **k):  # the disk fills while a result is written
        f = real_open(path, mode, *a, **k)
        if "w" in mode and str(path).endswith(".tmp"):
            f.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return f

    monkeypatch.setattr("builtins.open", full)
    with pytest.raises(OSError, match="No space left") as e:
        write_json(tmp_path / "x.json", {"a": 1})
    assert e.value.filename == str(tmp_path / "x.json") and not list(tmp_path.glob(".x.json.*"))


# ----------------------------------------------------------------------------- every command's --out

#: every subcommand that writes, with the other arguments it needs to reach its check of --out (the
#: test below holds this table to the parser); ``file``: its --out names a file, not a directory
OUT_COMMANDS = {
    "run": ("run --task humaneval --limit 1", "dir"),
    "compare": ("compare --limit 1", "dir"),
    "score": ("score --task humaneval --samples {tmp}/samples.jsonl", "file"),
    "plan": ("plan", "file"),
    "sweep": ("sweep --task humaneval --grid cpu-small", "dir"),
    "report": ("report {tmp}/empty", "dir"),
    "train-predictor": ("train-predictor --kind marginal --traces {tmp}/empty", "dir"),
    "diagnose": ("diagnose {tmp}/empty", "dir"),
    "calibrate-prefix": ("calibrate-prefix {tmp}/empty --alpha 0.05", "file"),
    "calibrate-online init": ("calibrate-online init --predictor {tmp}/empty", "dir"),
    "calibrate-online sweep": ("calibrate-online sweep cal {tmp}/empty --max-new-tokens 8", "dir"),
    "generate-data": ("generate-data", "dir"),
    "train-drafter": ("train-drafter --data {tmp}/empty", "dir"),
    "fit-copy-prior": ("fit-copy-prior --holdout-of {tmp}/empty", "dir"),
    "extract-features": ("extract-features --data {tmp}/empty", "dir"),
    "train-conditioned": ("train-conditioned --data {tmp}/empty --features {tmp}/features", "dir"),
}


def _commands_with_out(parser=None, prefix=()) -> set[str]:
    import argparse

    parser = parser or cli.build_parser()
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _commands_with_out(sub, (*prefix, name))
        elif "--out" in action.option_strings:
            found.add(" ".join(prefix))
    return found


def test_the_walk_covers_every_command_with_out():
    assert _commands_with_out() == set(OUT_COMMANDS)


@pytest.mark.parametrize("out, words", [
    ("''", "is empty"),
    ("/", "root directory"),
    ("{tmp}/../../../../../../../../../../..", "root directory"),
    ("{tmp}/link", "is a link"),
], ids=["empty", "root", "root-by-dots", "link"])
@pytest.mark.parametrize("command", list(OUT_COMMANDS))
def test_every_command_refuses_an_out_of_root_empty_or_link(command, out, words, tmp_path, capsys, monkeypatch):
    """No command writes into ``/`` or the current directory by ``--out ''``, or through a link
    given as its output directory (a file's directory, for a command whose --out is a file): each
    refuses in one line, exit 2, before any model loads, and leaves the link's target empty."""
    import vskip.engine.models.load as load

    monkeypatch.setattr(load, "load_pair", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "features").mkdir()
    (tmp_path / "features" / "index.json").write_text("{}")
    (tmp_path / "samples.jsonl").write_text(json.dumps({"task_id": "HumanEval/0", "completion": "pass"}) + "\n")
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    argv, kind = OUT_COMMANDS[command]
    out = out.format(tmp=tmp_path)
    if kind == "file" and out.endswith("link"):
        out += "/out.json"
    rc = cli.main(shlex.split(f"{argv.format(tmp=tmp_path)} --out {out}"))
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("vskip: error")]
    if kind == "file" and words == "root directory":
        words = "is a directory"  # --out / names a directory where a file is wanted
    assert rc == 2 and len(err) == 1 and words in err[0], err
    assert list(target.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == [
        "empty", "features", "link", "samples.jsonl", "target"]


def test_calibrate_online_init_copies_nothing_through_a_planted_link(tmp_path, outside, monkeypatch):
    """The one-rotation model's copy replaces a link planted at its file, and a link planted as
    its directory is refused: the file the link points at keeps its bytes."""
    from vskip.study.prefix import model as M

    src = tmp_path / "model" / M.KIND
    src.mkdir(parents=True)
    (src / "rot0.safetensors").write_bytes(b"weights")
    man = {"format": M.FORMAT, "gamma": 8, "d_model": 4, "rotations": [{"rotation": 0, "file": "rot0.safetensors"}]}
    monkeypatch.setattr(M, "read_rotations", lambda path, kind, fmt: (src, man, []))
    out = tmp_path / "out"
    (out / M.KIND).mkdir(parents=True)
    (out / M.KIND / "rot0.safetensors").symlink_to(outside)
    M.write_online_predictor(src.parent, 0, out)
    assert not (out / M.KIND / "rot0.safetensors").is_symlink()
    assert (out / M.KIND / "rot0.safetensors").read_bytes() == b"weights"
    assert outside.read_text() == "precious\n"
    other = tmp_path / "other"
    other.mkdir()
    (other / M.KIND).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileError, match="is a link"):
        M.write_online_predictor(src.parent, 0, other)
    assert not (tmp_path / "elsewhere").exists()


def test_a_full_disk_while_locking_names_the_lock_file(tmp_path, monkeypatch):
    import errno

    import vskip.files as files

    real = files._open_lock

    class Full:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "_open_lock", lambda path: Full(real(path)))
    with pytest.raises(OSError) as e:
        with DirLock(tmp_path, "run directory"):
            pass
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / ".lock")
