"""The sandbox: ordinary programs, and a corpus of hostile ones that must be contained.

Every hostile program runs under each sandbox kind this machine offers (bubblewrap when ``bwrap``
works, namespaces when util-linux ``unshare`` may create them, and always the rlimits fallback),
within small limits, and must come back as a failure or timeout within its limit, leaving no
process behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import tempfile
import textwrap
import time

import pytest

from vskip.bench import sandbox as S
from vskip.bench.sandbox import choice, kinds, procs


def _works(kind: str) -> bool:
    try:
        return S.sandbox_kind(kind) == kind
    except RuntimeError:
        return False


#: rlimits only where it runs programs as a fresh uid (as root with a Python any uid can read):
#: programs run as the scorer's own uid only in the tests that ask for rlimits-own-uid by name
KINDS = [k for k in ("rlimits", "bubblewrap", "namespaces") if _works(k)]
OWN = "rlimits-own-uid"
#: the rlimits kind this machine has: with a fresh uid, or the scorer's own
RLIMITS = "rlimits" if _works("rlimits") else OWN


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def run(code, kind, **kw):
    kw.setdefault("timeout", 5.0)
    return S.run_program(textwrap.dedent(code), isolation=kind, **kw)


def leftovers() -> list[int]:
    """Processes still running a sandbox program (zombies have an empty cmdline)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if S.PROGRAM_NAME.encode() in f.read():
                    found.append(int(name))
        except OSError:
            pass
    return found


def assert_no_leftovers():
    deadline = time.monotonic() + 3.0
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftovers() == []


def sandbox_dirs() -> set[str]:
    tmp = tempfile.gettempdir()
    return {d for d in os.listdir(tmp) if d.startswith("vskip-sbx-")}


# ----------------------------------------------------------------------------- ordinary programs


def test_kind_is_known_and_cached():
    assert S.sandbox_kind() in ("bubblewrap", "rlimits")
    assert S.sandbox_kind() == S.sandbox_kind()
    assert S.sandbox_kind(RLIMITS) == RLIMITS and S.sandbox_kind(OWN) == OWN
    info = S.sandbox_info()
    assert info["kind"] == S.sandbox_kind()
    with pytest.raises(ValueError, match="isolation"):
        S.sandbox_kind("docker")


def test_passing_and_failing_programs(kind):
    before = sandbox_dirs()
    r = run("print('hello'); import sys; print('err', file=sys.stderr)", kind)
    assert (r.status, r.returncode, r.kind) == ("passed", 0, kind)
    assert r.stdout_tail == "hello\n" and r.stderr_tail == "err\n"
    r = run("raise SystemExit(3)", kind)
    assert (r.status, r.returncode) == ("failed", 3)
    r = run("def f(:\n", kind)
    assert r.status == "failed" and "SyntaxError" in r.stderr_tail
    mods = "numpy, json" if importlib.util.find_spec("numpy") else "json"
    r = run(f"import {mods}, math; print(__name__)", kind)  # site-packages are reachable
    assert r.status == "passed" and r.stdout_tail == "__main__\n"
    assert sandbox_dirs() - before == set()  # work directories are removed


def test_minimal_environment_and_fresh_workdir(kind):
    r = run("""
        import os, sys
        print(sorted(os.environ))
        print(os.getcwd() == os.environ["HOME"], os.listdir("."), sys.flags.isolated)
        open("scratch.txt", "w").write("ok")
    """, kind)
    assert r.status == "passed", r.stderr_tail
    keys, rest = r.stdout_tail.splitlines()
    assert set(eval(keys)) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "PWD",
                               "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
    assert rest == f"True ['{S.PROGRAM_NAME}'] 1"


def test_timeout_must_be_positive():
    with pytest.raises(ValueError):
        S.run_program("pass", timeout=0)


# ----------------------------------------------------------------------------- hostile programs


def test_infinite_loop(kind):
    r = run("while True:\n    pass\n", kind, timeout=1.5)
    assert r.status == "timeout"
    assert r.seconds < 1.5 + 2.0
    assert_no_leftovers()


def test_fork_bomb(kind):
    # Unbounded: every process forks forever. The process limit (uid or pids cgroup) or the
    # process-count watchdog bounds it, and the kill at the timeout ends it.
    r = run("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, kind, timeout=1.5, nproc=16)
    assert r.status in ("timeout", "failed")
    assert r.seconds < 1.5 + 3.0
    assert_no_leftovers()


def test_fork_bomb_watchdog_as_root(monkeypatch):
    # Root is exempt from RLIMIT_NPROC: with neither a uid nor a pids cgroup of its own, the
    # process-count watchdog must kill the group at once.
    if os.geteuid() != 0:
        pytest.skip("only root without a uid of its own relies on the process-count watchdog")
    import vskip.bench.sandbox.run as sandbox_run

    monkeypatch.setattr(sandbox_run, "_make_pids_cgroup", lambda limit: None)
    r = S.run_program("import os\nwhile True:\n    try:\n        os.fork()\n"
                      "    except OSError:\n        pass\n",
                      timeout=1.5, nproc=8, isolation=OWN)
    # the watchdog, not the 1.5 s timeout, ended it (a timeout reports status "timeout"); no
    # wall-clock bound here: on a loaded machine the watchdog's own polling can be starved
    assert r.status == "failed" and "processes" in r.note
    assert_no_leftovers()


def test_fork_limit_bites(kind):
    # Bounded version: fork children that sleep, count how many forks succeeded.
    # RLIMIT_NPROC counts every task of the uid, so without a uid of its own the program may
    # have what the user already runs plus nproc.
    base = 0 if os.geteuid() == 0 else procs._count_uid_tasks(os.getuid())
    r = run("""
        import os, time
        ok = 0
        for _ in range(200):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(30)
                os._exit(0)
            ok += 1
        print("forked", ok)
    """, kind, timeout=5, nproc=12)
    if S.sandbox_info(kind)["nproc_enforced"]:
        assert r.status == "passed", r.stderr_tail
        assert int(r.stdout_tail.split()[-1]) <= 12 + base
    else:  # root without a uid or cgroup of its own: the watchdog kills the group instead
        assert r.status == "failed" and "processes" in r.note
    assert r.seconds < 5  # the sleeping children did not hold the run open
    assert_no_leftovers()


def test_allocate_20_gib(kind):
    r = run("x = bytearray(20 * 1024 ** 3)\nprint('allocated')\n", kind, memory_mb=1024)
    assert r.status == "failed"
    assert "allocated" not in r.stdout_tail and "MemoryError" in r.stderr_tail


def test_write_1_gib_file(kind):
    r = run("""
        block = b"x" * (1 << 20)
        with open("big.bin", "wb") as f:
            for _ in range(1024):
                f.write(block)
        print("wrote 1 GiB")
    """, kind, file_mb=8)
    assert r.status == "failed"
    assert "wrote" not in r.stdout_tail
    assert "File too large" in r.stderr_tail or "No space left" in r.stderr_tail


def test_write_outside_workdir(kind, tmp_path):
    target = tmp_path / "escaped.txt"
    r = run(f"""
        for path in [{str(target)!r}, "/usr/vskip-escape", "/etc/vskip-escape"]:
            try:
                with open(path, "w") as f:
                    f.write("x")
                print("WROTE", path)
            except OSError as e:
                print("refused", path, type(e).__name__)
    """, kind)
    info = S.sandbox_info(kind)
    if not (info["filesystem_read_only"] or info["separate_uid"]):
        for p in (target, "/usr/vskip-escape", "/etc/vskip-escape"):
            if os.path.exists(p):
                os.remove(p)
        pytest.skip("rlimits without a uid of its own cannot stop writes outside the working "
                    "directory (best effort only; use bubblewrap)")
    assert "WROTE" not in r.stdout_tail
    assert not target.exists()
    assert not os.path.exists("/usr/vskip-escape") and not os.path.exists("/etc/vskip-escape")


def test_kill_parent(kind):
    r = run("""
        import os, signal, time
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(0.5)
        print("still here")
    """, kind)
    # The parent it sees is the disposable runner; we are alive and report a failure. Under
    # namespaces the runner is the init of the program's pid namespace, which the kernel shields
    # from a SIGKILL sent from inside: the kill has no effect and the program goes on.
    if kind == "namespaces":
        assert r.status == "passed" and "still here" in r.stdout_tail
    else:
        assert r.status == "failed"
    assert r.seconds < 5
    os.kill(os.getpid(), 0)
    assert_no_leftovers()


def test_cannot_see_or_signal_the_scorer(kind):
    me = os.getpid()
    r = run(f"""
        import os, signal
        try:
            os.kill({me}, 0)
            print("CAN SIGNAL")
        except OSError as e:
            print("cannot signal", type(e).__name__)
    """, kind)
    info = S.sandbox_info(kind)
    if not (info["pid_namespace"] or info["separate_uid"]):
        pytest.skip("rlimits without a uid of its own: the program could signal us (only the "
                    "runner shields the direct parent)")
    assert "CAN SIGNAL" not in r.stdout_tail


def test_background_process_does_not_hold_the_run(kind):
    r = run("""
        import os, time
        if os.fork() == 0:
            time.sleep(60)
        print("parent done")
    """, kind, timeout=10)
    assert r.status == "passed" and "parent done" in r.stdout_tail
    assert r.seconds < 5
    assert_no_leftovers()


def test_network_socket(kind):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        r = run(f"""
            import socket
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(2)
            try:
                s.connect(("127.0.0.1", {port}))
                print("CONNECTED")
            except OSError as e:
                print("refused", type(e).__name__)
        """, kind)
    finally:
        server.close()
    assert r.status == "passed", r.stderr_tail
    if not S.sandbox_info(kind)["network_isolated"]:
        pytest.skip("no network isolation is possible without bubblewrap (rlimits only)")
    assert "CONNECTED" not in r.stdout_tail and "refused" in r.stdout_tail


def test_reading_host_secrets(kind, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("vskip-host-secret")
    secret.chmod(0o644)
    r = run(f"""
        for path in ["/etc/shadow", {str(secret)!r}, "/proc/1/environ"]:
            try:
                print("READ", path, open(path).read()[:40])
            except OSError as e:
                print("refused", path, type(e).__name__)
    """, kind)
    assert r.status == "passed", r.stderr_tail
    if not S.sandbox_info(kind)["filesystem_read_only"]:
        pytest.skip("rlimits cannot hide readable files of the host (use bubblewrap or namespaces)")
    assert "READ" not in r.stdout_tail and "vskip-host-secret" not in r.stdout_tail


def test_namespaces_stand_in_when_bubblewrap_is_missing(monkeypatch):
    if "namespaces" not in KINDS:
        pytest.skip("util-linux unshare may not create namespaces here")
    import shutil

    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "bwrap" else which(name))
    monkeypatch.delitem(choice._SETUPS, "auto", raising=False)
    try:
        assert S.check_isolation("auto") == "namespaces"
        assert S.run_program("print(6 * 7)").stdout_tail.strip() == "42"
    finally:
        choice._SETUPS.pop("auto", None)


def test_environment_secrets(kind, monkeypatch):
    secret = "vskip-secret-" + os.urandom(8).hex()
    monkeypatch.setenv("VSKIP_TEST_SECRET", secret)
    me = os.getpid()
    r = run(f"""
        import os
        print(dict(os.environ))
        try:
            print(open("/proc/{me}/environ", "rb").read())
        except OSError as e:
            print("environ unreadable", type(e).__name__)
    """, kind)
    assert r.status == "passed", r.stderr_tail
    lines = r.stdout_tail.splitlines()
    assert secret not in lines[0] and "VSKIP_TEST_SECRET" not in lines[0]
    info = S.sandbox_info(kind)
    if not (info["pid_namespace"] or info["separate_uid"]):
        pytest.skip("rlimits without a uid of its own: /proc/<scorer>/environ stays readable")
    assert secret not in r.stdout_tail


def test_no_view_of_its_own_memory(kind):
    """Under bubblewrap and namespaces the program has no /proc: neither its own memory
    (/proc/self/mem, where the scorer's nonce lives) nor its maps, by any path or descriptor."""
    r = run("""
        import os
        for path in ("/proc/self/mem", "/proc/self/maps", "/proc/1/mem"):
            try:
                os.close(os.open(path, os.O_RDONLY))
                print("OPENED", path)
            except OSError as e:
                print("refused", path, type(e).__name__)
    """, kind)
    assert r.status == "passed", r.stderr_tail
    if not S.sandbox_info(kind)["pid_namespace"]:
        pytest.skip("rlimits keeps the host's /proc (the verdict's hook refuses it; docs/security.md)")
    assert "OPENED" not in r.stdout_tail and r.stdout_tail.count("FileNotFoundError") == 3


def test_recursion_to_the_c_stack_limit(kind):
    r = run("""
        import sys
        sys.setrecursionlimit(10 ** 8)
        def f(n):
            return list(map(f, [n + 1]))
        f(0)
        print("returned")
    """, kind)
    assert r.status == "failed"
    assert "returned" not in r.stdout_tail
    assert_no_leftovers()


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_output_flood(kind, stream):
    r = run(f"""
        import sys
        chunk = "x" * 65536 + "\\n"
        while True:
            sys.{stream}.write(chunk)
    """, kind, max_output_bytes=4 << 20, tail_bytes=4096)
    assert r.status == "failed" and "output" in r.note
    assert len(r.stdout_tail) <= 4096 and len(r.stderr_tail) <= 4096
    assert r.seconds < 5
    assert_no_leftovers()


def test_sigterm_ignoring_program_still_times_out(kind):
    r = run("""
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
    """, kind, timeout=1.0)
    assert r.status == "timeout" and r.seconds < 4
    assert_no_leftovers()


def test_without_bubblewrap_untrusted_code_runs_only_when_rlimits_is_asked_for_by_name(monkeypatch, capsys):
    """auto falls back to rlimits only with consent: the refusal comes before any program runs,
    and as one line from the command line."""
    from vskip import cli
    from vskip.bench import sandbox

    monkeypatch.delenv("VSKIP_SANDBOX", raising=False)
    monkeypatch.setitem(choice._SETUPS, "auto", kinds._Setup("rlimits", False))
    with pytest.raises(sandbox.SandboxUnavailable, match="VSKIP_SANDBOX=rlimits"):
        sandbox.run_program("print(1)")
    assert sandbox.run_program("print(1)", isolation=RLIMITS).stdout_tail.strip() == "1"
    rc = cli.main(["score", "--task", "humaneval", "--samples", __file__])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("vskip: error: neither bubblewrap nor namespaces") and "Traceback" not in err
    monkeypatch.setenv("VSKIP_SANDBOX", RLIMITS)  # read by vskip.environment and passed down
    from vskip.environment import sandbox_preference

    assert sandbox.check_isolation(sandbox_preference()) == RLIMITS


def test_rlimits_never_runs_code_as_the_scorers_own_uid_unless_asked_for_by_that_name(monkeypatch):
    """When no fresh uid can run Python (as root with a closed installation, or without root),
    rlimits refuses, naming why and the opt-in; only rlimits-own-uid runs the program so."""
    monkeypatch.setattr(choice, "_probe", lambda setup: False)
    monkeypatch.setattr(choice, "_SETUPS", {})
    monkeypatch.setattr(choice.shutil, "which", lambda name: None)  # no bubblewrap, no unshare
    with pytest.raises(S.SandboxUnavailable, match="VSKIP_SANDBOX=rlimits-own-uid") as e:
        S.run_program("print(1)", isolation="rlimits")
    assert ("as root" in str(e.value)) == (os.geteuid() == 0)
    with pytest.raises(S.SandboxUnavailable, match="VSKIP_SANDBOX=rlimits-own-uid"):
        S.check_isolation("auto")
    assert S.sandbox_kind(OWN) == OWN
    assert S.run_program("print(1)", isolation=OWN).stdout_tail.strip() == "1"


def test_namespaces_hold_for_a_user_without_root():
    """Not root: the jail runs in a user namespace and drops to a uid of a nested one. Run the
    sandbox package (stdlib only) as nobody with the system Python to check it."""
    import shutil
    import subprocess

    py, setpriv = "/usr/bin/python3", shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None or not os.path.exists(py) or "namespaces" not in KINDS:
        pytest.skip("needs root (to become nobody), setpriv, /usr/bin/python3 and namespaces")
    d = tempfile.mkdtemp(prefix="vskip-userns-", dir="/tmp")
    try:
        os.chmod(d, 0o755)
        shutil.copytree(os.path.dirname(S.__file__), os.path.join(d, "vskip_sandbox"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for root, dirs, files in os.walk(d):
            for name in dirs + files:
                os.chmod(os.path.join(root, name), 0o755)
        probe = textwrap.dedent("""
            import json, sys
            sys.path.insert(0, sys.argv[1])
            import vskip_sandbox as S
            code = '''
            import os, socket
            print("uid", os.getuid())
            try:
                socket.create_connection(("127.0.0.1", 22), timeout=1); print("NET")
            except OSError: print("no network")
            try:
                open("/usr/vskip-escape", "w"); print("WROTE")
            except OSError: print("read-only")
            print("root holds", sorted(os.listdir("/")))
            '''
            r = S.run_program(code.replace("\\n            ", "\\n").strip(), isolation="namespaces")
            print(json.dumps({"status": r.status, "out": r.stdout_tail, "err": r.stderr_tail,
                              "info": S.sandbox_info("namespaces")}))
        """)
        out = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", py, "-I", "-c", probe, d],
                             capture_output=True, text=True, timeout=60)
        if "may not create namespaces" in out.stderr:
            pytest.skip("unprivileged user namespaces are disabled here")
        res = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert res["status"] == "passed", res["err"]
    assert res["info"]["running_as_root"] is False and res["info"]["kind"] == "namespaces"
    assert "uid 65534" in res["out"] and "no network" in res["out"] and "read-only" in res["out"]
    assert "NET" not in res["out"] and "WROTE" not in res["out"] and "'root'" not in res["out"]
