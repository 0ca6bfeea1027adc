"""How a scored program proves that its tests ran to the end, without a proof it can forge.

The scorer passes a completion only when the program exits with status 0 *and* a random nonce,
which the scorer sends on stdin, appears on stdout. The program :func:`build` writes is a small
runner around two code objects:

1. A guard, before any code of the completion runs, reads the nonce from file descriptor 0 and
   closes it, compiles the solution and the tests separately (a solution cannot swallow the
   tests into an unterminated string), and installs an audit hook (``sys.addaudithook``: a
   program can add hooks, never remove one). The nonce lives only in that hook's closure: in no
   global, file, environment variable or frame of the program.
2. The runner ``exec``-s the solution, then the tests, in a fresh ``__main__`` namespace.
3. On the last line the runner raises the audit event ``vskip.verdict``. The hook writes the
   nonce only when that event comes from the runner's own frame, at that very line, after the
   hook saw the runner's frame ``exec`` the tests' own code object at the tests' line. The
   runner's frame reaches its last line only when ``exec`` of the tests returned: a failed assert
   raises out of it first. ``sys.excepthook``, ``atexit``, a thread, a finaliser or a signal
   handler runs in a frame of its own, so none of them can make the hook write the nonce, and
   none can read it: nothing but the hook holds it.

The hook ends the program at once (exit status :data:`REFUSED_CODE`, one line on stderr) when
it tries a route to the hook's closure or to memory: ``gc.get_objects``/``get_referrers``/
``get_referents``, ``sys._current_frames``/``_current_exceptions``, ``sys.settrace``/
``setprofile``, ``sys.monitoring`` callbacks, adding an audit hook of its own, importing
``ctypes`` (or another C-level memory tool) by any name or path, opening anything under ``/proc``
or a memory device, starting another program (``exec``, ``spawn``, ``system``, ``Popen``: a
fresh interpreter has no hook), and installing a signal handler (``signal.signal`` is replaced
before the program runs: a handler is called with the frame it interrupted, which could be the
hook's). The official HumanEval harness disables most of the same functions for the same kind of
program. What remains possible is in ``docs/security.md``.
"""

from __future__ import annotations

#: exit status of a program the hook stopped
REFUSED_CODE = 86
#: the first words of the line the hook writes on stderr when it stops a program
REFUSED_MARK = "vskip-verdict: refused"
#: the audit event the runner raises on its last line
VERDICT_EVENT = "vskip.verdict"

# The guard. Everything it needs is bound in its closure before the program runs; the hook keeps
# the garbage collector off while it runs, so that no finaliser of the program runs inside it.
_GUARD = r'''
import sys as _vskip_sys


def _vskip_guard(solution, tests, tests_line, gate_line):
    import gc, os, _signal
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
    tests_code = compile(tests, "<tests>", "exec", dont_inherit=True)
    gate = _vskip_sys._getframe(1)
    getframe, write, exit_, realpath = _vskip_sys._getframe, os.write, os._exit, os.path.realpath
    gc_off, gc_on, gc_is_on = gc.disable, gc.enable, gc.isenabled
    refused_events = frozenset(REFUSED_EVENTS)
    refused_modules = frozenset(REFUSED_MODULES)
    tests_ran = []

    def refuse(what):
        write(2, ("\nREFUSED_MARK %s\n" % (what,)).encode("utf-8", "replace"))
        exit_(REFUSED_CODE)

    def refuse_signal(*args):
        refuse("signal.signal")

    def hook(event, args):
        was_on = gc_is_on()
        gc_off()
        try:
            if event == "VERDICT_EVENT":
                if tests_ran and getframe(1) is gate and gate.f_lineno == gate_line:
                    write(1, nonce)
            elif event == "exec":
                if args[0] is tests_code and getframe(1) is gate and gate.f_lineno == tests_line:
                    tests_ran.append(True)
            elif event in refused_events:
                refuse(event)
            elif event == "import":
                if str(args[0]).rpartition(".")[2] in refused_modules:
                    refuse("import " + str(args[0]))
            elif event == "open":
                path = args[0]
                if isinstance(path, (str, bytes)):
                    real = realpath(os.fsdecode(path))
                    if real == "/proc" or real.startswith(("/proc/", "/dev/mem", "/dev/kmem", "/dev/port")):
                        refuse("open " + real)
        except BaseException:
            exit_(REFUSED_CODE)
        finally:
            if was_on:
                gc_on()

    _signal.signal = refuse_signal
    _vskip_sys.modules.pop("signal", None)
    _vskip_sys.addaudithook(hook)
    return solution_code, tests_code
'''

#: audit events that end the program (routes to the hook's closure, to memory, or to a fresh
#: interpreter without the hook)
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


def _guard_source() -> str:
    return (_GUARD.replace("REFUSED_EVENTS", repr(REFUSED_EVENTS))
            .replace("REFUSED_MODULES", repr(REFUSED_MODULES))
            .replace("REFUSED_MARK", REFUSED_MARK)
            .replace("REFUSED_CODE", str(REFUSED_CODE))
            .replace("VERDICT_EVENT", VERDICT_EVENT))


def build(solution: str, tests: str) -> str:
    """The program that runs ``solution`` then ``tests`` in one ``__main__`` namespace, and
    writes the nonce it reads on stdin to stdout only when the tests returned."""
    head = _guard_source().strip("\n").splitlines()
    n = len(head)
    # line numbers (1-based) of the runner's lines, fixed by the guard's length
    tests_line, gate_line = n + 5, n + 7
    body = [
        f"_vskip_solution, _vskip_tests = _vskip_guard({solution!r}, {tests!r}, {tests_line}, {gate_line})",
        "del _vskip_guard",
        '_vskip_ns = {"__name__": "__main__", "__file__": __file__, "__builtins__": __builtins__}',
        "exec(_vskip_solution, _vskip_ns)",
        "exec(_vskip_tests, _vskip_ns)",
        "_vskip_sys.stdout.flush()",
        f"_vskip_sys.audit({VERDICT_EVENT!r})",
    ]
    lines = head + body
    assert lines[tests_line - 1].startswith("exec(_vskip_tests") and lines[gate_line - 1].startswith("_vskip_sys.audit")
    return "\n".join(lines) + "\n"
