"""The verdict a program cannot reach: every route that forged a pass before this design (the hook
re-entered, the runner's namespace swapped, a builtin, module or prompt helper shadowed, memory
read by a path the hook did not resolve) now fails, in every sandbox that may run hostile code;
and the residual routes do what docs/security.md says, no more."""

from __future__ import annotations

import textwrap

import pytest
from test_scoring import WRONG0, _namespaces_work, _rlimits_fresh_uid

from vskip.bench import scoring as SC
from vskip.bench import tasks as T
from vskip.bench.sandbox import run_program, sandbox_kind

MODES = ["auto"] + (["rlimits"] if _rlimits_fresh_uid() else []) + (["namespaces"] if _namespaces_work() else [])

#: prints every str or bytes value of every frame above it on a line of its own, then exits 0: a
#: pass, if one of them is the nonce
_WALK = """\
def _walk_and_exit(*args, **kwargs):
    import os, sys
    f = sys._getframe()
    while f is not None:
        for v in list(f.f_locals.values()):
            if type(v) is bytes:
                v = v.decode('latin-1')
            if type(v) is str:
                print('\\n' + v.strip(), flush=True)
        f = f.f_back
    os._exit(0)
"""
#: a dict that replaces the tests' ``check`` by a no-op when the tests define it
_SWAP = """\
import sys
class _D(dict):
    def __setitem__(self, k, v):
        dict.__setitem__(self, k, (lambda *a, **kw: None) if k == 'check' else v)
"""
TRUNCATE_WRONG = "def truncate_number(number: float) -> float:\n    return 0.5\n"
FIND_ZERO_WRONG = "    return 0.0\n\n\n"  # a continuation of HumanEval/32's prompt
#: reads /proc/self/mem through a directory descriptor the hook never saw a path for
_MEMORY_BY_DIR_FD = """\
import os, re
_root = os.open('/', os.O_RDONLY)
_fd = os.open('proc/self/maps', os.O_RDONLY, dir_fd=_root)
_maps = b''.join(iter(lambda: os.read(_fd, 65536), b'')).decode().splitlines()
_mem = os.open('proc/self/mem', os.O_RDONLY, dir_fd=_root)
_found = set()
for _line in _maps:
    _span, _perm = _line.split()[:2]
    _lo, _hi = (int(x, 16) for x in _span.split('-'))
    if 'r' not in _perm or '[v' in _line or _hi - _lo > 1 << 28:
        continue
    try:
        _found.update(re.findall(rb'VSKIP-DONE-[0-9a-f]{32}', os.pread(_mem, _hi - _lo, _lo)))
    except OSError:
        pass
for _x in _found:
    print('\\n' + _x.decode(), flush=True)
os._exit(0)
"""
#: a signal handler installed through a fresh ``_signal`` module, racing the hook for its frame
_FRESH_SIGNAL = """\
import _imp, importlib.machinery, os
_sig = _imp.create_builtin(importlib.machinery.ModuleSpec('_signal', importlib.machinery.BuiltinImporter))
def _on_alarm(signum, frame):
    while frame is not None:
        if 'nonce' in frame.f_code.co_freevars:
            for v in list(frame.f_locals.values()):
                if type(v) is bytes:
                    print('\\n' + v.decode('latin-1').strip(), flush=True)
            os._exit(0)
        frame = frame.f_back
_sig.signal(14, _on_alarm)
_sig.setitimer(0, 0.0005, 0.0005)
while True:
    try:
        open('x', 'w').close()
    except BaseException:
        pass
"""

#: name: (route: 1 the hook re-entered, 2 the namespace swapped, 3 a name the tests read shadowed; the task;
#: the completion; what the one line of a refusal names, or None for a plain failed assert)
ROUTES = {
    "hook_reentry_import_name": (1, "0", WRONG0 + _WALK + "class _S(str):\n    __str__ = _walk_and_exit\n"
                                 "__import__(_S('colorsys'))\n", "import of a name that is not a str"),
    "hook_reentry_open_path": (1, "0", WRONG0 + _WALK + "class _S(str):\n    __getitem__ = _walk_and_exit\n"
                               "    startswith = _walk_and_exit\nopen(_S('x'), 'w')\n",
                               "open of a path that is neither a str nor bytes"),
    "hook_reentry_builtin": (1, "0", WRONG0 + _WALK + "import builtins\nbuiltins.isinstance = _walk_and_exit\n"
                             "open('x', 'w')\n", None),
    "hook_reentry_module_function": (1, "0", WRONG0 + _WALK + "import os\nos.fsdecode = _walk_and_exit\n"
                                     "open('x', 'w')\n", None),
    "hook_reentry_signal_handler": (1, "0", WRONG0 + _FRESH_SIGNAL, "_imp.create_builtin"),
    "namespace_swap_through_frames": (2, "0", WRONG0 + _SWAP + (
        "_f = sys._getframe(0)\n"
        "while _f is not None:\n"
        "    _loc = _f.f_locals\n"
        "    for _name, _v in list(_loc.items()):\n"
        "        if type(_v) is dict and '__builtins__' in _v:\n"
        "            _loc[_name] = _D(_v)\n"
        "    _f = _f.f_back\n"), None),
    "namespace_swap_through_main": (2, "0", WRONG0 + _SWAP + (
        "import __main__\n"
        "for _name, _v in list(vars(__main__).items()):\n"
        "    if type(_v) is dict and '__builtins__' in _v:\n"
        "        setattr(__main__, _name, _D(_v))\n"), None),
    "builtin_shadow_by_def": (3, "2", TRUNCATE_WRONG + "def abs(x):\n    return 0\n", None),
    "builtin_shadow_in_builtins": (3, "2", TRUNCATE_WRONG + "import builtins\nbuiltins.abs = lambda x: 0\n", None),
    "builtin_shadow_from_a_thread": (3, "2", TRUNCATE_WRONG + (
        "import builtins, threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.05), setattr(builtins, 'abs', lambda x: 0))).start()\n"
        "time.sleep(0.2)\n"), "a thread"),
    "module_shadow_in_sys_modules": (3, "32", FIND_ZERO_WRONG + (
        "import sys, types, math\n_m = types.ModuleType('math')\n_m.__dict__.update(math.__dict__)\n"
        "_m.fabs = lambda x: 0.0\nsys.modules['math'] = _m\n"), None),
    "module_patched": (3, "32", FIND_ZERO_WRONG + "import math\nmath.fabs = lambda x: 0.0\n", None),
    "prompt_helper_redefined": (3, "32", FIND_ZERO_WRONG + "def poly(xs, x):\n    return 0.0\n", None),
    "prompt_helper_patched": (3, "32", FIND_ZERO_WRONG + "import math\nmath.pow = lambda *a: 0.0\n", None),
    # a probe, not a route that forged before: the program's uid cannot read its own memory after
    # the switch of uid, and there is no /proc; the hook refuses the directory descriptor anyway
    "memory_by_dir_fd": ("probe", "0", WRONG0 + _MEMORY_BY_DIR_FD, "open / (a directory)"),
}


def _score(task: str, completion: str, timeout: float = 3.0):
    problem = T.load_task("humaneval", ids=[task])[0]
    text = completion if completion.startswith("    ") else f"```python\n{completion}```"
    return SC.score(problem, text, timeout=timeout)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(ROUTES), ids=list(ROUTES))
def test_forged_pass_route(name, mode, monkeypatch):
    """Each route forged a pass before; now none passes, and a route the hook stops is named."""
    monkeypatch.setenv("VSKIP_SANDBOX", mode)
    _, task, completion, refused = ROUTES[name]
    res = _score(task, completion)
    assert not res.passed, res
    if refused is not None:
        assert res.detail.startswith(f"vskip-verdict: refused {refused}") or (
            name == "memory_by_dir_fd" and "No such file" in res.detail), res
    else:
        assert res.detail == "AssertionError", res


def test_the_entry_point_is_looked_up_by_name_and_type():
    """The tests get the entry point by its name from the solution, only a function (or a class,
    a partial, a cached function); the solution's other names reach them unless they shadow a
    builtin, and MBPP's tests still build the solution's own classes."""
    from test_scoring import GOOD0

    res = _score("0", GOOD0 + "has_close_elements = 5\n")
    assert not res.passed
    assert res.detail == "vskip-verdict: the entry point has_close_elements is missing or not a function"
    cached = "import functools\n\n\n@functools.lru_cache\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
    assert _score("55", cached).passed
    partial = GOOD0 + "\nimport functools\nhas_close_elements = functools.partial(has_close_elements)\n"
    assert _score("0", partial).passed
    p = T.load_task("mbpp", ids=["367"])[0]  # its tests build trees of the solution's class Node
    assert SC.score(p, p.reference).passed


# ----------------------------------------------------------------------------- residual routes

#: an object equal to everything
_ALWAYS_EQUAL = "class _E:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"


def _residual(mode, monkeypatch):
    monkeypatch.setenv("VSKIP_SANDBOX", mode)


@pytest.mark.parametrize("mode", MODES)
def test_residual_always_equal_result(mode, monkeypatch):
    """Can: pass a test that compares with ``==`` (HumanEval/0). Cannot: a test that compares by
    identity (HumanEval/72's ``is True``)."""
    _residual(mode, monkeypatch)
    assert _score("0", _ALWAYS_EQUAL + "def has_close_elements(numbers, threshold):\n    return _E()\n").passed
    assert not _score("72", _ALWAYS_EQUAL + "def will_it_fly(q, w):\n    return _E()\n").passed


@pytest.mark.parametrize("mode", MODES)
def test_residual_candidate_changes_what_the_tests_read_next(mode, monkeypatch):
    """Can: a candidate, when the tests call it, reaches the tests' namespace through its caller's
    frame and shadows a builtin for the asserts after it. Cannot: change an assert it faces first,
    or the builtins the tests started with."""
    _residual(mode, monkeypatch)
    later = ("def truncate_number(number: float) -> float:\n"
             "    import sys\n"
             "    sys._getframe(1).f_globals['abs'] = lambda x: 0\n"
             "    return {}\n")
    assert _score("2", later.format("0.5")).passed
    assert not _score("2", later.format("0.0")).passed  # the first assert compares without abs
    through_builtins = ("def truncate_number(number: float) -> float:\n"
                        "    import builtins\n    builtins.abs = lambda x: 0\n    return 0.5\n")
    assert not _score("2", through_builtins).passed


@pytest.mark.parametrize("mode", MODES)
def test_residual_tests_read_from_the_program_file(mode, monkeypatch):
    """Can: the tests are in the program's own file, so a solution may read their expected values
    (the known limit of checking in-process, as in the official harness). Cannot: find the nonce
    there (test_scoring.test_the_program_file_holds_no_marker)."""
    _residual(mode, monkeypatch)
    reader = textwrap.dedent("""\
        import ast
        _call = ast.parse(open(__file__).read()).body[-1].value
        _table = {}
        for _node in ast.walk(ast.parse(_call.args[1].value)):
            if isinstance(_node, ast.Compare) and isinstance(_node.left, ast.Call):
                _args = tuple(ast.literal_eval(a) for a in _node.left.args)
                _table[repr(_args)] = ast.literal_eval(_node.comparators[0])
        def has_close_elements(numbers, threshold):
            return _table[repr((numbers, threshold))]
        """)
    assert _score("0", reader).passed


@pytest.mark.parametrize("kind", [k for k in ("bubblewrap", "namespaces") if k in
                                  {m if m != "auto" else sandbox_kind("auto") for m in MODES}])
def test_residual_native_code_from_a_written_file(kind):
    """Can, under bubblewrap: map a file it wrote as executable, the first step of loading a shared
    library of its own (native code reads memory; docs/security.md). Cannot, under namespaces,
    whose writable directories are mounted noexec; and neither kind has a /proc to find a library
    in memory through."""
    res = run_program(textwrap.dedent("""\
        import mmap, os
        with open('lib.so', 'wb+') as f:
            f.write(bytes(4096))
            f.flush()
            try:
                mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC)
                print('EXEC')
            except OSError as e:
                print('NOEXEC', e.errno)
        print('PROC' if os.path.exists('/proc/self') else 'NOPROC')
        """), isolation=kind, timeout=5)
    assert res.status == "passed", res
    assert ("EXEC" if kind == "bubblewrap" else "NOEXEC") in res.stdout_tail.split()
    assert "NOPROC" in res.stdout_tail
