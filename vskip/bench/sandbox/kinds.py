"""The parts each sandbox kind is built from: its settings (:class:`_Setup`), a fresh uid to run as,
the bwrap prefix, and the directories of the Python installation it must see."""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class _Setup:
    kind: str  # "bubblewrap" | "namespaces" | "rlimits"
    drop_uid: bool  # run as a fresh unprivileged uid (only possible as root)
    bwrap_argv: tuple[str, ...] = ()  # the bwrap prefix, without the work dir parts
    tmpfs_workdir: bool = False  # bwrap supports --size/--perms: the work dir is a tmpfs
    unshare_argv: tuple[str, ...] = ()  # the `unshare` prefix of the namespaces kind
    nest_user: bool = False  # namespaces kind, not root: drop to a uid of a nested user namespace




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
    # no /proc: the program gets no view of its own memory (/proc/self/mem) or of other processes
    argv += ["--dev", "/dev"]
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
