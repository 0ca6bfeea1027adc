"""Processes of a sandboxed program: a pids cgroup, finding its descendants, killing them all."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time

from .scripts import _minimal_env


def _is_root() -> bool:
    return os.geteuid() == 0


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
