"""Run one untrusted Python program in a sandbox and report how it ended.

Each call of :func:`run_program` writes the program into a fresh temporary directory and runs
``python -I`` on it (``sys.executable``) in its own session, under a small intermediate *runner*
process, with a minimal environment, resource limits, a bounded capture of stdout/stderr, a
wall-clock timeout that kills the whole process group, and removal of the directory afterwards.

Three kinds of sandbox exist; :func:`sandbox_kind` says which one this machine gets (``auto``
takes the first that works of bubblewrap and namespaces, and refuses rather than fall back to
rlimits, which must be asked for by name):

``"bubblewrap"``
    ``bwrap`` (Debian package ``bubblewrap``) is installed and works. The program gets fresh
    network, pid, ipc and uts namespaces (no network at all, no view of our processes), a
    read-only view of the system and of the Python installation only, a size-limited tmpfs as
    its working directory and ``/tmp``, and dies with its parent. When we run as root the runner
    also drops to a fresh unprivileged uid of its own, so the process limit bites.
``"namespaces"``
    No bubblewrap, but util-linux ``unshare`` may create namespaces: the same fresh namespaces,
    entered by ``unshare`` (inside a user namespace when we are not root); a jail script
    (:data:`_JAIL`) builds a read-only root on a tmpfs from binds of the system and the Python
    installation, pivots into it, then gives up root (a fresh uid as root; uid 65534 of a
    nested user namespace otherwise).
``"rlimits"``
    Resource limits, the runner and the process-group kill only. There is no network isolation,
    and writing outside the working directory is prevented only by ordinary file permissions (a
    best effort: as root, nothing stops it). When we run as root and a fresh uid can run Python,
    the runner drops to that uid; otherwise a pids cgroup (when root may create one) and a
    process-count watchdog bound the number of processes, since RLIMIT_NPROC does not apply to
    root.

Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

__all__ = [
    "SandboxResult",
    "run_program",
    "sandbox_kind",
    "sandbox_info",
    "PROGRAM_NAME",
]

#: File name of the program inside its working directory.
PROGRAM_NAME = "vskip_program.py"
#: Working directory of the program under bubblewrap.
SANDBOX_DIR = "/sandbox"
#: Exit status of the runner when it could not start the program (a sandbox error).
RUNNER_ERROR_CODE = 125
RUNNER_ERROR_MARK = "vskip-sandbox-runner:"

# The runner: sets the limits, drops to the sandbox uid when asked, then forks the program and
# exits with its status (128 + signal when killed by one). The program sees the runner as its
# parent, so killing "its parent" kills only the disposable runner.
_RUNNER = r"""
import json, os, resource, sys
cfg = json.loads(sys.argv[1])
try:
    for name, soft, hard in cfg["limits"]:
        key = getattr(resource, name, None)
        if key is None:
            continue
        _, cur_hard = resource.getrlimit(key)
        if cur_hard != resource.RLIM_INFINITY and os.geteuid() != 0:
            hard = min(hard, cur_hard)
            soft = min(soft, hard)
        resource.setrlimit(key, (soft, hard))
    if cfg.get("cgroup"):
        with open(cfg["cgroup"] + "/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
    uid = cfg.get("uid")
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise OSError("the uid did not change")
    pid = os.fork()
except BaseException as exc:
    sys.stderr.write("%s %r\n" % (cfg["mark"], exc))
    sys.stderr.flush()
    os._exit(cfg["error_code"])
if pid == 0:
    # The program runs in this forked child, in a fresh __main__ namespace, as `python -I`
    # would run it (site's builtins and site-packages on sys.path; .pth files are skipped).
    program, extra_path = cfg["program"], cfg["path"]
    del cfg, pid
    import runpy, site
    site.setquit()
    site.setcopyright()
    site.sethelper()
    sys.path[:] = [p for p in sys.path if p] + [p for p in extra_path if p not in sys.path]
    sys.argv[:] = [program]
    runpy.run_path(program, run_name="__main__")
    raise SystemExit(0)
while True:
    try:
        _, status = os.waitpid(pid, 0)
        break
    except InterruptedError:
        continue
if os.WIFSIGNALED(status):
    os._exit(128 + os.WTERMSIG(status))
os._exit(os.WEXITSTATUS(status))
"""

# The jail of the "namespaces" kind: runs as root of fresh mount/net/pid/ipc/uts namespaces (made
# by util-linux `unshare`; inside a user namespace when we are not root), builds a new root on a
# tmpfs holding only read-only binds of the system and Python directories, a size-limited /tmp and
# working directory, a fresh /proc and a few device nodes, pivots into it and detaches the old
# root. Then it gives up root: to a fresh uid (when the host is root; the runner switches), or to
# an unprivileged uid of a nested user namespace (when not root), and execs the runner.
_JAIL = r"""
import ctypes, json, os, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18

def mount(src, dst, fs, flags, data=None):
    enc = lambda x: None if x is None else x.encode()
    if libc.mount(enc(src), enc(dst), enc(fs), ctypes.c_ulong(flags), enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "mount %s on %s: %s" % (src, dst, os.strerror(e)))

def write(path, text):
    with open(path, "w") as f:
        f.write(text)

try:
    os.umask(0o022)
    mount(None, "/", None, REC | PRIVATE)
    root = cfg["root"]
    mount("tmpfs", root, "tmpfs", NOSUID | NODEV, "size=4m,mode=0755")
    size = "size=%d" % cfg["disk_bytes"]
    for d, mode in (("/tmp", "1777"), (cfg["workdir"], "0777")):
        os.makedirs(root + d, exist_ok=True)
        mount("tmpfs", root + d, "tmpfs", NOSUID | NODEV, size + ",mode=" + mode)
    with open(cfg["program_host"], "rb") as src, open(root + cfg["program"], "wb") as dst:
        dst.write(src.read())
    os.chmod(root + cfg["program"], 0o644)
    for src in cfg["ro"]:
        dst = root + src
        if os.path.islink(src):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.readlink(src), dst)
            continue
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            write(dst, "")
        mount(src, dst, None, BIND | REC)
        mount(None, dst, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)
    os.makedirs(root + "/dev", exist_ok=True)
    for name in ("null", "zero", "full", "random", "urandom"):
        write(root + "/dev/" + name, "")
        mount("/dev/" + name, root + "/dev/" + name, None, BIND)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", NOSUID | NODEV | NOEXEC)
    os.mkdir(root + "/.old")
    os.chdir(root)
    if libc.syscall(cfg["pivot_root"], b".", b".old") != 0:
        e = ctypes.get_errno()
        raise OSError(e, "pivot_root: " + os.strerror(e))
    os.chdir("/")
    if libc.umount2(b"/.old", 2) != 0:  # MNT_DETACH: the old root is gone from this namespace
        raise OSError(ctypes.get_errno(), "umount of the old root")
    os.rmdir("/.old")
    mount(None, "/", None, REMOUNT | RDONLY | NOSUID | NODEV)
    if cfg["nest_user"]:  # root of a user namespace: become an unprivileged uid of a nested one
        if libc.unshare(0x10000000) != 0:
            raise OSError(ctypes.get_errno(), "nested user namespace")
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", "65534 0 1")
        write("/proc/self/gid_map", "65534 0 1")
        os.setgid(65534)
        os.setuid(65534)
    os.chdir(cfg["workdir"])
    os.execv(cfg["python"], [cfg["python"], "-I", "-S", "-c", cfg["runner"], cfg["runner_cfg"]])
except BaseException as exc:
    sys.stderr.write("%s jail: %r\n" % (cfg["mark"], exc))
    sys.stderr.flush()
    os._exit(cfg["error_code"])
"""

#: the pivot_root system call's number per machine (glibc has no wrapper for it)
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


@dataclass(frozen=True)
class SandboxResult:
    """How one program ended.

    ``status`` is ``"passed"`` (exit status 0), ``"failed"`` (any other exit, a signal, or a
    limit other than time), ``"timeout"`` (wall clock or CPU time ran out) or ``"error"`` (the
    sandbox itself could not run the program). ``returncode`` is the runner's exit status
    (128 + N when the program died of signal N; negative when the runner itself was killed).
    """

    status: str
    returncode: int | None
    stdout_tail: str
    stderr_tail: str
    seconds: float
    kind: str = "rlimits"
    note: str = ""


@dataclass(frozen=True)
class _Setup:
    kind: str  # "bubblewrap" | "namespaces" | "rlimits"
    drop_uid: bool  # run as a fresh unprivileged uid (only possible as root)
    bwrap_argv: tuple[str, ...] = ()  # the bwrap prefix, without the work dir parts
    tmpfs_workdir: bool = False  # bwrap supports --size/--perms: the work dir is a tmpfs
    unshare_argv: tuple[str, ...] = ()  # the `unshare` prefix of the namespaces kind
    nest_user: bool = False  # namespaces kind, not root: drop to a uid of a nested user namespace


_SETUP_LOCK = threading.Lock()
_SETUPS: dict[str, _Setup] = {}


def _minimal_env(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _is_root() -> bool:
    return os.geteuid() == 0


def _fresh_uid() -> int | None:
    """A random high uid mapped in our user namespace (no user owns it), or None."""
    lo, hi = 1_100_000_000, 2_000_000_000
    try:
        ranges = []
        with open("/proc/self/uid_map") as f:
            for line in f:
                inside, _outside, count = (int(x) for x in line.split())
                ranges.append((inside, inside + count))
    except OSError:
        return None
    for _ in range(16):
        uid = lo + secrets.randbelow(hi - lo)
        if any(a <= uid < b for a, b in ranges):
            return uid
    return None


def _python_dirs() -> list[str]:
    """Directories the Python installation needs, minus those the system binds already cover."""
    cands = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(sys.executable),
        os.path.dirname(os.path.realpath(sys.executable)),
    }
    covered = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
    out: list[str] = []
    for d in sorted({os.path.realpath(c) for c in cands if c} | {c for c in cands if c}, key=len):
        if d in ("/", "") or not os.path.isdir(d):
            continue
        if any(d == c or d.startswith(c.rstrip("/") + "/") for c in covered + out):
            continue
        out.append(d)
    return out


def _bwrap_base(privileged: bool, with_perms: bool) -> list[str] | None:
    exe = shutil.which("bwrap")
    if exe is None:
        return None
    argv = [exe, "--die-with-parent", "--new-session"]
    if privileged:
        # Real root without a user namespace, so that the runner can switch to its own uid;
        # capabilities are cut to the two it needs for that, and it loses them on setuid.
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                 "--unshare-cgroup-try", "--cap-drop", "ALL",
                 "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-all"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/alternatives"):
        if os.path.exists(f):
            argv += ["--ro-bind", f, f]
    if os.path.isdir("/etc/ld.so.conf.d"):
        argv += ["--ro-bind", "/etc/ld.so.conf.d", "/etc/ld.so.conf.d"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    made: set[str] = set()
    for d in _python_dirs():
        # bwrap makes missing parents 0700; the sandbox uid must be able to traverse them.
        parent = os.path.dirname(d)
        chain = []
        while parent not in ("/", "") and parent not in made:
            chain.append(parent)
            parent = os.path.dirname(parent)
        for p in reversed(chain):
            argv += ["--perms", "0755", "--dir", p] if with_perms else ["--dir", p]
            made.add(p)
        argv += ["--ro-bind", d, d]
    return argv


def _jail_binds() -> list[str]:
    """What the namespaces jail binds read-only: the system directories (or their symlinks), the
    loader's files, and the Python installation."""
    out = [d for d in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
           if os.path.islink(d) or os.path.isdir(d)]
    out += [f for f in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime") if os.path.exists(f)]
    out += [d for d in ("/etc/ld.so.conf.d", "/etc/alternatives") if os.path.isdir(d)]
    return out + _python_dirs()


def _site_dirs() -> list[str]:
    """The site-packages directories `python -I` would put on sys.path."""
    import site

    try:
        dirs = list(site.getsitepackages())
    except AttributeError:  # pragma: no cover - very old virtualenv
        dirs = []
    return [d for d in dirs if os.path.isdir(d)]


def _bwrap_supports_sizes(exe: str) -> bool:
    try:
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    text = out.stdout + out.stderr
    return "--size" in text and "--perms" in text


def _probe(setup: _Setup) -> bool:
    res = _run(
        "import sys\nprint('vskip-probe-ok')\n",
        setup,
        timeout=20.0,
        memory_mb=1024,
        file_mb=4,
        nofile=64,
        nproc=16,
        max_output_bytes=1 << 16,
        tail_bytes=4096,
        disk_mb=8,
    )
    return res.status == "passed" and "vskip-probe-ok" in res.stdout_tail


def _determine_setup(prefer: str) -> _Setup:
    root = _is_root()
    if prefer in ("auto", "bubblewrap"):
        exe = shutil.which("bwrap")
        if exe is not None:
            sized = _bwrap_supports_sizes(exe)
            variants = [(True, True), (False, False)] if root else [(False, False)]
            for privileged, drop in variants:
                base = _bwrap_base(privileged, sized)
                if base is None:
                    continue
                setup = _Setup("bubblewrap", drop, tuple(base), sized)
                if _probe(setup):
                    return setup
        if prefer == "bubblewrap":
            raise RuntimeError(
                "bubblewrap was requested but `bwrap` is missing or does not work here "
                "(install the Debian package bubblewrap)"
            )
    if prefer in ("auto", "namespaces"):
        setup = _namespaces_setup(root)
        if setup is not None and _probe(setup):
            return setup
        if prefer == "namespaces":
            raise RuntimeError(
                "namespaces were requested but util-linux `unshare` is missing or may not create "
                "namespaces here (unprivileged user namespaces may be disabled)"
            )
    if root:
        setup = _Setup("rlimits", True)
        if _probe(setup):
            return setup
    return _Setup("rlimits", False)


def _namespaces_setup(root: bool) -> _Setup | None:
    exe = shutil.which("unshare")
    if exe is None or os.uname().machine not in _PIVOT_ROOT:
        return None
    argv = [exe, "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
    if not root:
        argv += ["--user", "--map-root-user"]
    return _Setup("namespaces", root, unshare_argv=tuple(argv), nest_user=not root)


#: the isolation kinds a user may name (``$VSKIP_SANDBOX`` or ``isolation=``)
KINDS = ("auto", "bubblewrap", "namespaces", "rlimits")


def _get_setup(isolation: str | None = None) -> _Setup:
    prefer = isolation or os.environ.get("VSKIP_SANDBOX", "auto") or "auto"
    if prefer not in KINDS:
        raise ValueError(f"unknown sandbox isolation {prefer!r}; use {', '.join(KINDS)}")
    with _SETUP_LOCK:
        if prefer not in _SETUPS:
            _SETUPS[prefer] = _determine_setup(prefer)
        return _SETUPS[prefer]


class SandboxUnavailable(RuntimeError):
    """No isolating sandbox works here and nobody accepted running without one."""


def check_isolation(isolation: str | None = None) -> str:
    """The sandbox kind that will run generated code; refuses (:class:`SandboxUnavailable`) when
    only rlimits would, unless rlimits was asked for by name (``isolation`` or
    ``$VSKIP_SANDBOX=rlimits``): then the program would have the network, could write outside
    its directory and see other processes, so running it must be a decision, not a fallback."""
    prefer = isolation or os.environ.get("VSKIP_SANDBOX", "auto") or "auto"
    setup = _get_setup(prefer)
    if setup.kind == "rlimits" and prefer == "auto":
        as_root = " and as root" if _is_root() and not setup.drop_uid else ""
        raise SandboxUnavailable(
            "neither bubblewrap nor namespaces (util-linux unshare) work here, so generated code would "
            f"run with the network, a writable filesystem and a view of other processes{as_root}; install "
            "bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) or set VSKIP_SANDBOX=rlimits to accept that")
    return setup.kind


def sandbox_kind(isolation: str | None = None) -> str:
    """``"bubblewrap"`` when bwrap is present and works here, else ``"rlimits"`` (probed once).

    ``$VSKIP_SANDBOX`` (``auto``, ``bubblewrap`` or ``rlimits``) overrides the choice.
    """
    return _get_setup(isolation).kind


def sandbox_info(isolation: str | None = None) -> dict:
    """What the sandbox enforces on this machine (for reports and for tests)."""
    s = _get_setup(isolation)
    root = _is_root()
    isolated = s.kind in ("bubblewrap", "namespaces")
    return {
        "kind": s.kind,
        "network_isolated": isolated,
        "filesystem_read_only": isolated,
        "pid_namespace": isolated,
        "separate_uid": s.drop_uid or s.nest_user,
        "nproc_enforced": (not root) or s.drop_uid
        or (s.kind == "rlimits" and _pids_cgroup_parent() is not None),
        "running_as_root": root,
    }


# ----------------------------------------------------------------------------- pids cgroup

_CGROUP_PARENT: list[str | None] = []
_CGROUP_LOCK = threading.Lock()


def _pids_cgroup_parent() -> str | None:
    """A cgroup directory where we (root) may create children with a pids limit, or None."""
    with _CGROUP_LOCK:
        if _CGROUP_PARENT:
            return _CGROUP_PARENT[0]
        found = None
        if _is_root():
            try:
                found = _find_pids_cgroup()
            except (OSError, ValueError, IndexError):
                found = None
        _CGROUP_PARENT.append(found)
        return found


def _find_pids_cgroup() -> str | None:
    v1_mount = v2_mount = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if not rfields:
                continue
            if rfields[0] == "cgroup" and "pids" in rfields[-1].split(","):
                v1_mount = fields[4]
            elif rfields[0] == "cgroup2":
                v2_mount = v2_mount or fields[4]
    rel_v1 = rel_v2 = None
    with open("/proc/self/cgroup") as f:
        for line in f:
            hid, ctrls, path = line.rstrip("\n").split(":", 2)
            if hid == "0" and ctrls == "":
                rel_v2 = path
            elif "pids" in ctrls.split(","):
                rel_v1 = path
    if v1_mount and rel_v1 is not None:
        d = os.path.join(v1_mount, rel_v1.lstrip("/"))
        if os.access(d, os.W_OK):
            return d
    if v2_mount and rel_v2 is not None:
        d = os.path.join(v2_mount, rel_v2.lstrip("/"))
        try:
            with open(os.path.join(d, "cgroup.subtree_control")) as f:
                if "pids" in f.read().split() and os.access(d, os.W_OK):
                    return d
        except OSError:
            return None
    return None


def _make_pids_cgroup(limit: int) -> str | None:
    parent = _pids_cgroup_parent()
    if parent is None:
        return None
    path = os.path.join(parent, f"vskip-sbx-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(limit))
        return path
    except OSError:
        try:
            os.rmdir(path)
        except OSError:
            pass
        return None


def _remove_cgroup(path: str) -> None:
    for _ in range(200):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.01)


# ----------------------------------------------------------------------------- process helpers


def _scan_procs() -> list[tuple[int, int, int]]:
    """(pid, ppid, session id) of every visible process."""
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        try:
            out.append((int(name), int(rest[1]), int(rest[3])))
        except (IndexError, ValueError):
            continue
    return out


def _tree(root_pid: int) -> set[int]:
    """Descendants of root_pid plus every process in its session (root_pid led it)."""
    procs = _scan_procs()
    children: dict[int, list[int]] = {}
    found = {root_pid}
    for pid, ppid, sid in procs:
        children.setdefault(ppid, []).append(pid)
        if sid == root_pid:
            found.add(pid)
    stack = [root_pid]
    while stack:
        for c in children.get(stack.pop(), ()):
            if c not in found:
                found.add(c)
                stack.append(c)
    return found


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_tree(pid: int) -> None:
    _kill_group(pid)
    for _ in range(3):
        others = [p for p in _tree(pid) if p != pid and p != os.getpid()]
        if not others:
            return
        for p in others:
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of uid (a fresh uid only the sandbox used)."""
    code = "import os,signal\nos.setgroups([]);os.setgid(%d);os.setuid(%d)\n" % (uid, uid)
    code += "for _ in range(3):\n    try: os.kill(-1, signal.SIGKILL)\n    except OSError: pass\n"
    try:
        subprocess.run([sys.executable, "-I", "-S", "-c", code], env=_minimal_env("/"),
                       timeout=10, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, close_fds=True)
    except (OSError, subprocess.SubprocessError):
        pass


def _count_uid_tasks(uid: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) owned by uid."""
    total = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                ruid = threads = None
                for line in f:
                    if line.startswith("Uid:"):
                        ruid = int(line.split()[1])
                    elif line.startswith("Threads:"):
                        threads = int(line.split()[1])
                if ruid == uid:
                    total += threads or 1
        except (OSError, ValueError, IndexError):
            continue
    return total


def _tail(buf: bytearray) -> str:
    return buf.decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------- running


def run_program(
    code: str,
    timeout: float = 10.0,
    memory_mb: int = 2048,
    file_mb: int = 16,
    nofile: int = 256,
    nproc: int = 64,
    max_output_bytes: int = 32 << 20,
    tail_bytes: int = 16 << 10,
    disk_mb: int = 64,
    isolation: str | None = None,
    stdin: bytes | None = None,
) -> SandboxResult:
    """Run ``code`` as a Python program in the sandbox and return how it ended. ``stdin``: bytes
    the program reads on its standard input (at most a pipe's buffer, 64 KiB), else none.

    Limits: ``timeout`` seconds of wall clock (and about as much CPU time), ``memory_mb`` of
    address space per process, ``file_mb`` per written file, ``nofile`` open files, ``nproc``
    processes/threads, ``max_output_bytes`` of stdout+stderr (the program is killed beyond it;
    only the last ``tail_bytes`` of each stream are kept) and, under bubblewrap, ``disk_mb`` of
    tmpfs for the working directory. ``isolation`` forces ``"bubblewrap"`` or ``"rlimits"``.
    """
    if timeout <= 0:
        raise ValueError("timeout must be positive")
    if stdin is not None and len(stdin) > 1 << 16:
        raise ValueError("stdin is limited to 64 KiB")
    check_isolation(isolation)
    setup = _get_setup(isolation)
    return _run(code, setup, timeout, memory_mb, file_mb, nofile, nproc, max_output_bytes,
                tail_bytes, disk_mb, stdin)


def _run(code, setup: _Setup, timeout, memory_mb, file_mb, nofile, nproc, max_output_bytes,
         tail_bytes, disk_mb, stdin=None) -> SandboxResult:
    start = time.monotonic()
    root = _is_root()
    uid = _fresh_uid() if setup.drop_uid else None
    if setup.drop_uid and uid is None:
        return SandboxResult("error", None, "", "no free uid for the sandbox", 0.0, setup.kind,
                             "no free uid")
    if not root:
        # RLIMIT_NPROC counts every task of our uid: allow what already runs plus nproc.
        nproc_limit = _count_uid_tasks(os.getuid()) + nproc
    else:
        nproc_limit = nproc
    # The kernel exempts root from RLIMIT_NPROC: without our own uid, use a pids cgroup (in the
    # rlimits kind, where the runner can join it) and watch the process count as well.
    watch_nproc = root and uid is None
    cgroup = _make_pids_cgroup(nproc + 2) if (watch_nproc and setup.kind == "rlimits") else None
    if cgroup is not None:
        watch_nproc = False

    host_dir = tempfile.mkdtemp(prefix="vskip-sbx-")
    try:
        prog_host = os.path.join(host_dir, PROGRAM_NAME)
        with open(prog_host, "w", encoding="utf-8") as f:
            f.write(code)
        os.chmod(prog_host, 0o644)
        if setup.kind == "bubblewrap":
            if setup.tmpfs_workdir:
                os.chmod(host_dir, 0o755)
                workdir = SANDBOX_DIR
                wd_args = ["--perms", "1777", "--size", str(disk_mb << 20), "--tmpfs", "/tmp",
                           "--perms", "0777", "--size", str(disk_mb << 20), "--tmpfs", workdir,
                           "--ro-bind", prog_host, f"{workdir}/{PROGRAM_NAME}"]
            else:
                workdir = SANDBOX_DIR
                if uid is not None:
                    os.chown(host_dir, uid, uid)
                wd_args = ["--tmpfs", "/tmp", "--bind", host_dir, workdir]
            # The private /tmp hides any part of the Python installation below /tmp (a checkout
            # or virtual environment there): bind those parts again on top of it.
            made = {"/tmp"}
            for d in _python_dirs():
                if not d.startswith("/tmp/"):
                    continue
                chain, parent = [], os.path.dirname(d)
                while parent not in made:
                    chain.append(parent)
                    parent = os.path.dirname(parent)
                for q in reversed(chain):  # traversable by the sandbox uid
                    wd_args += (["--perms", "0755"] if setup.tmpfs_workdir else []) + ["--dir", q]
                    made.add(q)
                wd_args += ["--ro-bind", d, d]
            wd_args += ["--remount-ro", "/", "--chdir", workdir]
            prefix = list(setup.bwrap_argv) + wd_args
            cwd = "/"
        elif setup.kind == "namespaces":
            workdir = SANDBOX_DIR
            os.mkdir(os.path.join(host_dir, "root"))
            os.chmod(host_dir, 0o755)
            prefix = list(setup.unshare_argv)
            cwd = "/"
        else:
            workdir = host_dir
            if uid is not None:
                os.chown(host_dir, uid, uid)
            prefix = []
            cwd = host_dir
        cpu = int(math.ceil(timeout)) + 1
        cfg = {
            "limits": [
                ["RLIMIT_CPU", cpu, cpu + 1],
                ["RLIMIT_AS", memory_mb << 20, memory_mb << 20],
                ["RLIMIT_FSIZE", file_mb << 20, file_mb << 20],
                ["RLIMIT_NOFILE", nofile, nofile],
                ["RLIMIT_CORE", 0, 0],
                ["RLIMIT_NPROC", nproc_limit, nproc_limit],
            ],
            "uid": uid,
            "cgroup": cgroup,
            "path": _site_dirs(),
            "program": f"{workdir}/{PROGRAM_NAME}",
            "mark": RUNNER_ERROR_MARK,
            "error_code": RUNNER_ERROR_CODE,
        }
        argv = prefix + [sys.executable, "-I", "-S", "-c", _RUNNER, json.dumps(cfg)]
        if setup.kind == "namespaces":
            jail = {
                "root": os.path.join(host_dir, "root"), "workdir": workdir, "disk_bytes": disk_mb << 20,
                "program_host": prog_host, "program": f"{workdir}/{PROGRAM_NAME}", "ro": _jail_binds(),
                "pivot_root": _PIVOT_ROOT[os.uname().machine], "nest_user": setup.nest_user,
                "python": sys.executable, "runner": _RUNNER, "runner_cfg": json.dumps(cfg),
                "mark": RUNNER_ERROR_MARK, "error_code": RUNNER_ERROR_CODE,
            }
            argv = prefix + [sys.executable, "-I", "-S", "-c", _JAIL, json.dumps(jail)]
        return _supervise(argv, cwd, _minimal_env(workdir), setup, uid, timeout, nproc_limit,
                          watch_nproc, max_output_bytes, tail_bytes, start, stdin)
    finally:
        if cgroup is not None:
            _remove_cgroup(cgroup)
        shutil.rmtree(host_dir, ignore_errors=True)


def _supervise(argv, cwd, env, setup, uid, timeout, nproc_limit, watch_nproc,
               max_output_bytes, tail_bytes, start, stdin=None) -> SandboxResult:
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
        )
    except OSError as exc:
        return SandboxResult("error", None, "", f"could not start the sandbox: {exc}",
                             time.monotonic() - start, setup.kind, "spawn failed")
    if stdin is not None:  # fits the pipe's buffer: never blocks, whatever the program does
        try:
            proc.stdin.write(stdin)
        except OSError:
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    total = 0
    note = ""
    killed_for = None
    sel = selectors.DefaultSelector()
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f.fileno(), selectors.EVENT_READ)
    deadline = start + timeout
    next_watch = time.monotonic()
    open_fds = set(bufs)
    exited_at = None
    try:
        while open_fds:
            now = time.monotonic()
            if killed_for is None and now >= deadline:
                killed_for = "timeout"
                _kill_tree(proc.pid)
            if exited_at is None and proc.poll() is not None:
                exited_at = now
                # Whatever the runner left behind (daemons holding our pipes) goes now.
                _kill_tree(proc.pid)
            if exited_at is not None and now - exited_at > 1.0:
                break
            if watch_nproc and killed_for is None and now >= next_watch:
                next_watch = now + 0.02
                if len(_tree(proc.pid)) > nproc_limit + 4:
                    killed_for = "nproc"
                    _kill_tree(proc.pid)
            wait = 0.02 if (watch_nproc or exited_at is not None) else 0.25
            wait = max(0.0, min(wait, deadline - now)) if killed_for is None else 0.05
            for key, _ in sel.select(wait):
                fd = key.fd
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                total += len(chunk)
                buf = bufs[fd]
                buf += chunk
                if len(buf) > tail_bytes:
                    del buf[: len(buf) - tail_bytes]
                if total > max_output_bytes and killed_for is None:
                    killed_for = "output"
                    _kill_tree(proc.pid)
        if proc.poll() is None:
            _kill_tree(proc.pid)
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            rc = proc.wait()
    finally:
        sel.close()
        _kill_tree(proc.pid)
        if uid is not None and setup.kind == "rlimits":
            _kill_uid(uid)
        for f in (proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
    seconds = time.monotonic() - start
    out = _tail(bufs[out_fd])
    err = _tail(bufs[err_fd])
    if killed_for == "timeout":
        status, note = "timeout", f"killed after {timeout:g}s of wall clock"
    elif killed_for == "output":
        status, note = "failed", f"killed: output exceeded {max_output_bytes} bytes"
    elif killed_for == "nproc":
        status, note = "failed", f"killed: more than {nproc_limit} processes"
    elif rc == RUNNER_ERROR_CODE and RUNNER_ERROR_MARK in err:
        status, note = "error", "the sandbox runner failed"
    elif setup.kind == "bubblewrap" and rc == 1 and err.startswith("bwrap:"):
        status, note = "error", "bubblewrap could not set up the sandbox"
    elif rc == 128 + signal.SIGXCPU or rc == -signal.SIGXCPU:
        status, note = "timeout", "CPU time limit"
    elif rc == 0:
        status = "passed"
    else:
        status = "failed"
        if rc is not None and rc > 128:
            try:
                note = f"program died of {signal.Signals(rc - 128).name}"
            except ValueError:
                pass
        elif rc is not None and rc < 0:
            note = "the runner was killed"
    return SandboxResult(status, rc, out, err, seconds, setup.kind, note)
