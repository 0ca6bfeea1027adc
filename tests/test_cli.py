"""Bad input exits non-zero with one clear line and no traceback (README.md, "Using it": every
failure prints one line naming what failed, and the file where a file is at fault)."""

import json
import subprocess
import sys

import pytest


def vskip(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "vskip", *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(res, needle):
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    lines = [l for l in res.stderr.strip().splitlines() if l.strip()]
    assert lines and lines[-1].startswith("vskip: error:"), res.stderr
    assert needle in lines[-1], res.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["run", "--task", "nope", "--out", "x"], "argument --task: invalid choice: 'nope'"),
        (["run", "--task", "humaneval", "--policy", "nope", "--out", "x"], "invalid choice"),
        (["run", "--task", "humaneval", "--eta-b", "1.5", "--out", "x"], "eta_b must lie in [0, 1]"),
        (["run", "--task", "humaneval", "--eta-c", "-0.1", "--out", "x"], "eta_c must lie in [0, 1]"),
        (["run", "--task", "humaneval", "--gamma", "0", "--out", "x"], "gamma must lie in 1..512"),
        (["run", "--task", "humaneval", "--limit", "0", "--out", "x"], "--limit"),
        (["run", "--task", "humaneval", "--ids", "HumanEval/9999", "--out", "x"], "9999"),
        (["generate", ""], "empty"),
        (["generate", "hi", "--verifier", "/nonexistent/model"], "does not exist"),
        (["generate", "hi", "--drafter", "/nonexistent/drafter"], "does not exist"),
        (["generate", "hi", "--copy-prior", "/nonexistent/copy_prior.json"], "does not exist"),
        (["score", "--task", "humaneval", "--samples", "x"], "samples file {out} does not exist"),
    ],
)
def test_bad_input_is_one_line(args, needle, tmp_path):
    args = [a if a != "x" else str(tmp_path / "out") for a in args]
    assert_one_line_error(vskip(*args), needle.format(out=tmp_path / "out"))


def test_help_lists_commands():
    res = vskip("--help")
    assert res.returncode == 0
    for cmd in ("run", "generate", "score", "sweep", "report", "train-drafter", "train-predictor", "diagnose",
                "fit-copy-prior", "plan", "calibrate-prefix"):
        assert cmd in res.stdout


def test_score_command(tmp_path):
    samples = tmp_path / "s.jsonl"
    rows = [
        {"task_id": "HumanEval/0", "completion": "```python\ndef has_close_elements(numbers, threshold):\n"
         "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```"},
        {"task_id": "HumanEval/1", "completion": "def separate_paren_groups(s):\n    return []\n"},
    ]
    samples.write_text("\n".join(json.dumps(r) for r in rows))
    res = vskip("score", "--task", "humaneval", "--samples", str(samples))
    assert res.returncode == 0, res.stderr
    assert "pass@1 = 0.5000 (1/2)" in res.stdout


def test_the_parser_imports_neither_torch_nor_numpy():
    import subprocess
    import sys

    code = ("import sys, vskip.cli; vskip.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_light_registrations_name_what_the_modules_hold():
    from vskip.commands import predictors, sweep
    from vskip.study import grids, traces
    from vskip.study.prefix import model as prefix_model

    assert sweep.GRID_NAMES == tuple(grids.GRIDS)
    assert predictors.PREDICTOR_KINDS == traces.KINDS + (prefix_model.KIND,)


def test_the_shared_flags_are_each_defined_once():
    """--threads, --verifier, --device and --task are spelled in one add_argument each, in the shared
    groups of vskip/commands/flags.py; the commands take them through those groups."""
    import ast
    from pathlib import Path

    import vskip

    root = Path(vskip.__file__).parent
    flags = ("--threads", "--verifier", "--device", "--task")
    found = {f: [] for f in flags}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and arg.value in found:
                        found[arg.value].append(f"{path.relative_to(root).as_posix()}:{node.lineno}")
    for flag, where in found.items():
        assert len(where) == 1 and where[0].startswith("commands/flags.py:"), (flag, where)


@pytest.mark.parametrize("argv", [["run", "--task", "nope", "--out", "x"], ["compare", "--task", "nope"],
                                  ["score", "--task", "nope", "--samples", "s.jsonl"],
                                  ["sweep", "--task", "nope", "--grid", "kmin", "--out", "x"]])
def test_an_unknown_task_exits_2_naming_the_tasks(argv, tmp_path, capsys):
    from vskip import cli
    from vskip.bench.tasks import ALL_TASKS

    with pytest.raises(SystemExit) as e:
        cli.main([str(tmp_path / a) if a in ("x", "s.jsonl") else a for a in argv])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vskip: error: argument --task: invalid choice: 'nope'"), lines
    assert all(repr(t) in lines[0] for t in ALL_TASKS), lines
    assert not (tmp_path / "x").exists()


def test_no_conditioned_drafter_is_called_shipped(capsys):
    """None ships: the help names the drafter a user trains, and the name the loader knows for
    installed weights refuses with one line saying how to make them, before any model loads."""
    from vskip import cli
    from vskip.engine.models.load import load_pair
    from vskip.engine.runtime import Runtime

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "none ships" in help_text and "smollm2-135m-conditioned" not in help_text
    with pytest.raises(FileNotFoundError, match="no conditioned drafter ships with vskip: train one"):
        load_pair(Runtime(), drafter="smollm2-135m-conditioned")


#: every command that decodes through the loop, with what else it needs to parse
BATCHING = {"run": ["run", "--task", "humaneval", "--out", "o"], "compare": ["compare"],
            "sweep": ["sweep", "--grid", "kmin"],
            "calibrate-online sweep": ["calibrate-online", "sweep", "cal", "p", "--out", "o", "--max-new-tokens", "8"]}


def _batch_action(parser, argv):
    """The --batch-size action of the (sub)command ``argv`` names."""
    import argparse

    for word in argv:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        parser = sub.choices[word]
    return next(a for a in parser._actions if "--batch-size" in a.option_strings)


@pytest.mark.parametrize("name", list(BATCHING))
def test_every_decoding_command_takes_the_one_batch_flag(name, capsys):
    """run, compare, sweep and calibrate-online sweep take --batch-size from one definition
    (flags.add_batch_flag): the same help and default, and the parser refuses a value outside 1..1024."""
    from vskip.commands import build_parser

    parser, argv = build_parser(), BATCHING[name]
    assert parser.parse_args(argv).batch_size == 1 and parser.parse_args(argv + ["--batch-size", "7"]).batch_size == 7
    mine, runs = _batch_action(parser, argv), _batch_action(parser, BATCHING["run"])
    assert (mine.help, mine.default) == (runs.help, 1) and "side by side" in mine.help
    for bad, needle in (("0", "must lie in 1..1024, got 0"), ("1025", "must lie in 1..1024"), ("two", "an integer")):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv + ["--batch-size", bad])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "argument --batch-size" in err and needle in err, err
