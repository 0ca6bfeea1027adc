"""How a scored program proves that its tests ran to the end, without a proof it can reach.

The scorer passes a completion only when the program exits with status 0 *and* a random nonce,
which the scorer sends on stdin, appears on stdout. The program :func:`build` writes is a runner
function around three code objects (the solution, the tests, and for HumanEval the prompt's own
helpers), in these steps:

1. A guard, before any code of the completion runs, reads the nonce from file descriptor 0 and
   closes it, compiles the three apart (a solution cannot swallow the tests into a string),
   takes a snapshot of the builtins and of the modules the tests and helpers import, and
   installs an audit hook (``sys.addaudithook``: a program can add hooks, never remove one). The
   nonce lives only in the hook's closure, and the guard returns before the completion runs: it
   is in no global, file, environment variable or live frame of the program.
2. The runner ``exec``-s the solution in a namespace of its own, then builds the tests' namespace
   afresh: the builtins and imported modules as they were before the completion ran, the entry
   point looked up by name and checked for its exact type, the prompt's helpers (``poly``,
   ``encode_cyclic``) from the prompt run apart, and the solution's other names unless they
   shadow a builtin. Everything the runner uses it bound before the completion ran.
3. The tests' first statement raises the audit event ``vskip.tests``; the hook marks the tests as
   begun only when that frame runs the tests' own code object, in a plain ``dict``, called by the
   runner's frame at the tests' line. On its last line the runner raises ``vskip.verdict``, which
   the frame reaches only when the tests returned (a failed assert raises out first); the hook
   writes the nonce only when that event comes from the runner's frame at that line, after the
   mark. ``sys.excepthook``, ``atexit``, a finaliser or a signal handler runs in a frame of its
   own, so none of them can make the hook write the nonce.

The hook never calls a method of an object the program made and looks up no global name: it uses
only what its closure bound before the program ran, compares exact types (``type(x) is str``)
and identities, and checks an opened path with ``os.stat`` alone. So no code of the program ever
runs while the hook's frame, which holds the nonce, is on the stack.

The hook ends the program at once (exit status :data:`REFUSED_CODE`, one line on stderr) when it
tries a route to the hook's closure, to memory or beside the runner: ``gc.get_objects``/
``get_referrers``/``get_referents``, ``sys._current_frames``/``_current_exceptions``,
``sys.settrace``/``setprofile``, ``sys.monitoring`` callbacks, an audit hook of its own, a thread,
``ctypes`` (or another C-level memory tool) by any name or path, an import by a name that is not a
plain ``str``, opening anything on ``/proc`` or a memory device or a directory (the start of a
``dir_fd`` path), or a path that is not a plain ``str`` or ``bytes``, starting another program
(a fresh interpreter has no hook), and installing a signal handler (``signal.signal`` is
replaced, and ``_imp.create_builtin``, which could build a fresh ``_signal``, refuses once every
built-in module is loaded: a handler is called with the frame it interrupted, which could be the
hook's). What remains possible is in ``docs/security.md``.
"""

from __future__ import annotations

import ast
import threading

#: exit status of a program the hook stopped
REFUSED_CODE = 86
#: the first words of the line the hook writes on stderr when it stops a program
REFUSED_MARK = "vskip-verdict: refused"
#: the audit event the runner raises on its last line
VERDICT_EVENT = "vskip.verdict"
#: the audit event the tests' first statement raises
TESTS_EVENT = "vskip.tests"
#: the first words of the line the runner writes when the entry point is missing or not a function
ENTRY_MARK = "vskip-verdict: the entry point"

# The guard: runs before the program, returns the compiled code and the snapshots; the hook it
# installs binds everything it uses in its closure and keeps the garbage collector off while it
# runs, so that no finaliser of the program runs inside it.
_GUARD = r'''
def _vskip_guard(solution, tests, helpers, modules, tests_line, gate_line):
    import builtins, gc, os, sys, _imp, _signal, _stat, _thread
    chunks = []
    while not chunks or not chunks[-1].endswith(b"\n"):
        chunk = os.read(0, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    nonce = b"\n" + b"".join(chunks).strip() + b"\n"
    del chunks, chunk
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)  # fd 0 again: the program's stdin is empty
    solution_code = compile(solution, "<solution>", "exec", dont_inherit=True)
    tests_code = compile('__import__("sys").audit("@TESTS_EVENT@")\n' + tests, "<tests>", "exec",
                         dont_inherit=True)
    helpers_code = compile(helpers, "<prompt>", "exec", dont_inherit=True)
    for name in sys.builtin_module_names:  # every built-in module exists now: none is built later
        __import__(name)
    pristine = tuple(builtins.__dict__.items())
    snapshots = []
    for name in modules:
        try:
            snapshots.append((name, tuple(__import__(name).__dict__.items())))
        except ImportError:
            pass
    gate = sys._getframe(1)
    getframe, write, exit_, stat = sys._getframe, os.write, os._exit, os.stat
    is_chr, is_dir = _stat.S_ISCHR, _stat.S_ISDIR
    gc_off, gc_on, gc_is_on = gc.disable, gc.enable, gc.isenabled
    type_, str_, bytes_, int_, dict_, os_error, value_error = type, str, bytes, int, dict, OSError, ValueError
    memory_devices = frozenset(os.makedev(1, minor) for minor in (1, 2, 4))  # mem, kmem, port
    try:
        proc_dev = os.stat("/proc").st_dev
    except OSError:
        proc_dev = -1
    refused_events = frozenset(@REFUSED_EVENTS@)
    refused_modules = frozenset(@REFUSED_MODULES@)
    begun = []

    def refuse(what):
        write(2, ("\n@REFUSED_MARK@ %s\n" % (what,)).encode("utf-8", "replace"))
        exit_(@REFUSED_CODE@)

    def refuse_signal(*args, **kwargs):
        refuse("signal.signal")

    def refuse_create_builtin(*args, **kwargs):
        refuse("_imp.create_builtin")

    def refuse_thread(*args, **kwargs):
        refuse("a thread")

    def check_open(path):
        kind = type_(path)
        if kind is int_:  # a descriptor the program opened already
            return
        if kind is not str_ and kind is not bytes_:
            refuse("open of a path that is neither a str nor bytes")
        try:
            st = stat(path)
        except (os_error, value_error):
            return
        name = path if kind is str_ else path.decode("utf-8", "replace")
        if st.st_dev == proc_dev or (is_chr(st.st_mode) and st.st_rdev in memory_devices):
            refuse("open " + name + " (/proc or a memory device)")
        if is_dir(st.st_mode):
            refuse("open " + name + " (a directory)")

    def hook(event, args):
        was_on = gc_is_on()
        gc_off()
        try:
            if event == "@TESTS_EVENT@":
                frame = getframe(1)
                if (not begun and frame.f_code is tests_code and frame.f_back is gate
                        and gate.f_lineno == tests_line and type_(frame.f_globals) is dict_):
                    begun.append(True)
            elif event == "@VERDICT_EVENT@":
                if begun and getframe(1) is gate and gate.f_lineno == gate_line:
                    write(1, nonce)
            elif event in refused_events:
                refuse(event)
            elif event == "import":
                name = args[0]
                if type_(name) is not str_:
                    refuse("import of a name that is not a str")
                if name.rpartition(".")[2] in refused_modules:
                    refuse("import " + name)
            elif event == "open":
                check_open(args[0])
        except:  # noqa: E722 - a bare except looks up no name the program could have rebound
            exit_(@REFUSED_CODE@)
        finally:
            if was_on:
                gc_on()

    _signal.signal = refuse_signal
    _imp.create_builtin = refuse_create_builtin
    for name in dir(_thread):  # no code runs beside the runner (Python 3.11 raises no event for a thread)
        if name.startswith("start_"):
            setattr(_thread, name, refuse_thread)
    if "threading" in sys.modules:
        sys.modules["threading"]._start_new_thread = refuse_thread
    sys.modules.pop("signal", None)
    sys.addaudithook(hook)
    return solution_code, tests_code, helpers_code, pristine, tuple(snapshots)
'''

# The runner: everything it uses after the solution ran is bound before it, in its own frame.
_RUNNER = r'''
def _vskip_run(solution, tests, helpers, entry, modules, tests_line, gate_line):
    import builtins, gc, os, sys
    from functools import _lru_cache_wrapper, partial
    from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
    codes = _vskip_guard(solution, tests, helpers, modules, tests_line, gate_line)
    solution_code, tests_code, helpers_code, pristine, snapshots = codes
    run, audit, flush, gc_off, write, exit_ = exec, sys.audit, sys.stdout.flush, gc.disable, os.write, os._exit
    type_, str_, dict_, list_, module_ = type, str, dict, list, ModuleType
    entry_types = (FunctionType, BuiltinFunctionType, MethodType, partial, _lru_cache_wrapper, type)
    solution_ns = {"__name__": "__main__", "__file__": __file__, "__builtins__": builtins}
    run(solution_code, solution_ns)
    gc_off()  # no finaliser of the program runs from here on
    names = dict_(pristine)
    copies = dict_()
    for module, pairs in snapshots:
        copies[module] = module_(module)
        copies[module].__dict__.update(pairs)
    real_import = names["__import__"]

    def tests_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and type_(name) is str_ and name in copies:
            return copies[name]
        return real_import(name, globals, locals, fromlist, level)

    names["__import__"] = tests_import
    tests_ns = {"__name__": "__main__", "__builtins__": names}
    found = False
    for name, value in list_(solution_ns.items()):
        if type_(name) is not str_:
            continue
        if name == entry:
            kind = type_(value)
            for ok in entry_types:
                found = found or kind is ok
            tests_ns[name] = value
        elif not name.startswith("__") and name not in names:
            tests_ns[name] = value
    if not found:
        write(2, ("\n@ENTRY_MARK@ %s is missing or not a function\n" % (entry,)).encode())
        exit_(1)
    helpers_ns = {"__name__": "__main__", "__builtins__": names}
    run(helpers_code, helpers_ns)
    for name, value in list_(helpers_ns.items()):
        if not name.startswith("__") and name != entry:
            tests_ns[name] = value
    run(tests_code, tests_ns)
    flush()
    audit("@VERDICT_EVENT@")
'''

#: audit events that end the program (routes to the hook's closure, to memory, to code beside the
#: runner, or to a fresh interpreter without the hook)
REFUSED_EVENTS = (
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
    "sys.monitoring.register_callback", "sys.addaudithook",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.addressof", "ctypes.string_at", "ctypes.wstring_at",
    "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile", "subprocess.Popen",
)
#: modules that read or write raw memory, refused by the last part of their name
REFUSED_MODULES = ("ctypes", "_ctypes", "cffi", "_cffi_backend", "_testcapi", "_testinternalcapi",
                   "_testmultiphase", "_xxsubinterpreters", "_xxinterpchannels", "_interpreters")


def _source(text: str) -> str:
    for key, value in (("REFUSED_EVENTS", repr(REFUSED_EVENTS)), ("REFUSED_MODULES", repr(REFUSED_MODULES)),
                       ("REFUSED_MARK", REFUSED_MARK), ("REFUSED_CODE", str(REFUSED_CODE)),
                       ("VERDICT_EVENT", VERDICT_EVENT), ("TESTS_EVENT", TESTS_EVENT), ("ENTRY_MARK", ENTRY_MARK)):
        text = text.replace(f"@{key}@", value)
    return text.strip("\n")


#: scoring builds its programs from threads, and CPython 3.11 can fail an ``ast.parse`` that runs
#: while another thread parses ("AST constructor recursion depth mismatch", CPython gh-106905)
_PARSE = threading.Lock()


def imported_modules(*sources: str) -> list[str]:
    """The top-level modules the code of ``sources`` imports by an absolute name without a dot
    (``import math``, ``from random import randint``): those the tests get as they were before the
    completion ran."""
    names: set[str] = set()
    for src in sources:
        try:
            with _PARSE:
                tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names if "." not in a.name}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and "." not in node.module:
                names.add(node.module)
    return sorted(names)


def build(solution: str, tests: str, entry: str, helpers: str = "") -> str:
    """The program that runs ``solution``, then ``tests`` against the name ``entry`` (and the names
    ``helpers``, benchmark code run apart, defines), and writes the nonce it reads on stdin to
    stdout only when the tests returned."""
    head = (_source(_GUARD) + "\n\n\n" + _source(_RUNNER)).splitlines()
    tests_line = next(i for i, line in enumerate(head, 1) if line.strip() == "run(tests_code, tests_ns)")
    gate_line = next(i for i, line in enumerate(head, 1) if line.strip().startswith("audit("))
    modules = imported_modules(tests, helpers)
    call = (f"_vskip_run({solution!r}, {tests!r}, {helpers!r}, {entry!r}, {modules!r}, {tests_line}, "
            f"{gate_line})")
    return "\n".join(head + ["", "", call]) + "\n"
