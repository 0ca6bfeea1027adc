"""Which sandbox this machine gets (bubblewrap, namespaces or rlimits), probed once by running a
small program in it, what each enforces, and :func:`run_program`, the one way in."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

from .kinds import _bwrap_base, _Setup
from .procs import _is_root, _pids_cgroup_parent
from .run import SandboxResult, _run
from .scripts import _PIVOT_ROOT

_SETUP_LOCK = threading.Lock()
_SETUPS: dict[str, _Setup] = {}


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
    if prefer == OWN_UID:
        return _Setup("rlimits", False)
    if root:
        setup = _Setup("rlimits", True)
        if _probe(setup):
            return setup
    if prefer == "rlimits":  # never the scorer's own uid (root, or the user's files) without the loud name
        raise SandboxUnavailable(_no_fresh_uid(root))
    return _Setup("rlimits", False)


#: the explicit opt-in to run generated code as the scorer's own uid (root included)
OWN_UID = "rlimits-own-uid"


def _closed_to_others(d: str) -> str | None:
    """The first directory from ``/`` down to ``d`` that another uid cannot search (or, for ``d``
    itself, read), or None."""
    parts = os.path.realpath(d).split(os.sep)
    for i in range(1, len(parts) + 1):
        p = os.sep.join(parts[:i]) or os.sep
        need = 0o005 if i == len(parts) else 0o001
        try:
            if os.stat(p).st_mode & need != need:
                return p
        except OSError:
            return p
    return None


def _no_fresh_uid(root: bool) -> str:
    """Why rlimits cannot run a program as a fresh uid here, and the ways out."""
    if not root:
        why = ("without root, rlimits cannot switch to a fresh uid, so generated code would run as your own "
               "uid and could read and change your files")
    else:
        from .kinds import _python_dirs

        closed = [c for d in _python_dirs() for c in [_closed_to_others(d)] if c]
        where = (f" ({closed[0]} is closed to other users: the installation under it must be readable, and "
                 "every directory above it searchable, by any uid)") if closed else ""
        why = f"a fresh uid cannot run this Python installation{where}, so generated code would run as root"
    return (f"{why}; use bubblewrap (apt-get install bubblewrap) or namespaces, or set "
            f"VSKIP_SANDBOX={OWN_UID} to accept that")


def _namespaces_setup(root: bool) -> _Setup | None:
    exe = shutil.which("unshare")
    if exe is None or os.uname().machine not in _PIVOT_ROOT:
        return None
    argv = [exe, "--mount", "--net", "--pid", "--ipc", "--uts", "--fork", "--kill-child"]
    if not root:
        argv += ["--user", "--map-root-user"]
    return _Setup("namespaces", root, unshare_argv=tuple(argv), nest_user=not root)


#: the isolation kinds a caller may name (``isolation=``; vskip passes ``$VSKIP_SANDBOX``, read by
#: :mod:`vskip.environment`: this package reads no environment, so it can be copied alone)
KINDS = ("auto", "bubblewrap", "namespaces", "rlimits", "rlimits-own-uid")


def _get_setup(isolation: str | None = None) -> _Setup:
    prefer = isolation or "auto"
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
    prefer = isolation or "auto"
    setup = _get_setup(prefer)
    if setup.kind == "rlimits" and prefer == "auto":
        as_root = " and as root" if _is_root() and not setup.drop_uid else ""
        accept = "rlimits" if setup.drop_uid else OWN_UID
        raise SandboxUnavailable(
            "neither bubblewrap nor namespaces (util-linux unshare) work here, so generated code would "
            f"run with the network, a writable filesystem and a view of other processes{as_root}; install "
            f"bubblewrap (Debian/Ubuntu: apt-get install bubblewrap) or set VSKIP_SANDBOX={accept} to accept that")
    return OWN_UID if setup.kind == "rlimits" and not setup.drop_uid else setup.kind


def sandbox_kind(isolation: str | None = None) -> str:
    """``"bubblewrap"`` when bwrap is present and works here, else ``"namespaces"`` or
    ``"rlimits"`` (probed once); ``"rlimits-own-uid"`` when rlimits runs programs as the scorer's
    own uid (only when asked for by that name).

    ``$VSKIP_SANDBOX`` (one of :data:`KINDS`) overrides the choice.
    """
    s = _get_setup(isolation)
    return OWN_UID if s.kind == "rlimits" and not s.drop_uid else s.kind


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
