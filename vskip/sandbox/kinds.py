"""Which sandbox this machine gets (bubblewrap, namespaces or rlimits), probed once, and what each
enforces."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass

from .procs import _is_root, _pids_cgroup_parent
from .scripts import _PIVOT_ROOT

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
    from .run import _run

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
