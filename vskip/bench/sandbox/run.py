"""Running one program: a fresh directory, the kind's prefix, the runner, and a supervisor that
enforces time, output and process limits and reports how it ended."""

from __future__ import annotations

import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from .kinds import _fresh_uid, _jail_binds, _python_dirs, _Setup, _site_dirs
from .procs import (_count_uid_tasks, _is_root, _kill_group, _kill_tree, _kill_uid, _make_pids_cgroup,
                    _pids_cgroup_parent, _remove_cgroup, _tail, _tree)
from .scripts import (_JAIL, _PIVOT_ROOT, _RUNNER, PROGRAM_NAME, RUNNER_ERROR_CODE, RUNNER_ERROR_MARK, SANDBOX_DIR,
                      _minimal_env)


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


# ----------------------------------------------------------------------------- running

#: a program's host directory is ``<tmp>/vskip-sbx-<pid of the scorer>-<random>``
STALE_PREFIX = "vskip-sbx-"
_cleaned = False


def _scorer_gone(name: str) -> bool:
    """Whether ``name`` is ``vskip-sbx-<pid>-...`` of a scorer that no longer runs (not ours)."""
    pid = name[len(STALE_PREFIX):].split("-", 1)[0]
    if not name.startswith(STALE_PREFIX) or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
        return False  # its scorer still runs
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive under another user, or not ours to judge


def _clean_stale_dirs() -> None:
    """Once per process: remove the program directories, and the pids cgroups (with what still
    runs in them), that a killed scorer left behind."""
    global _cleaned
    if _cleaned:
        return
    _cleaned = True
    root = tempfile.gettempdir()
    for name in _listdir(root):
        path = os.path.join(root, name)
        if _scorer_gone(name) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
    parent = _pids_cgroup_parent() if _is_root() else None
    for name in _listdir(parent) if parent else []:
        if _scorer_gone(name):
            _remove_cgroup(os.path.join(parent, name))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


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

    _clean_stale_dirs()
    host_dir = tempfile.mkdtemp(prefix=f"{STALE_PREFIX}{os.getpid()}-")
    try:
        prog_host = os.path.join(host_dir, PROGRAM_NAME)
        with open(prog_host, "w", encoding="utf-8") as f:
            f.write(code)
        os.chmod(prog_host, 0o644)
        workdir, prefix, cwd = _prefix(setup, host_dir, prog_host, uid, disk_mb)
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
                "root": os.path.join(host_dir, "root"), "proc": os.path.join(host_dir, "proc"),
                "workdir": workdir, "disk_bytes": disk_mb << 20,
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


def _prefix(setup: _Setup, host_dir: str, prog_host: str, uid: int | None, disk_mb: int):
    """(the program's working directory, the command prefix of the kind, the cwd to start in)."""
    if setup.kind == "namespaces":
        os.mkdir(os.path.join(host_dir, "root"))
        os.chmod(host_dir, 0o755)
        return SANDBOX_DIR, list(setup.unshare_argv), "/"
    if setup.kind != "bubblewrap":
        if uid is not None:
            os.chown(host_dir, uid, uid)
        return host_dir, [], host_dir
    workdir = SANDBOX_DIR
    if setup.tmpfs_workdir:
        os.chmod(host_dir, 0o755)
        wd_args = ["--perms", "1777", "--size", str(disk_mb << 20), "--tmpfs", "/tmp",
                   "--perms", "0777", "--size", str(disk_mb << 20), "--tmpfs", workdir,
                   "--ro-bind", prog_host, f"{workdir}/{PROGRAM_NAME}"]
    else:
        if uid is not None:
            os.chown(host_dir, uid, uid)
        wd_args = ["--tmpfs", "/tmp", "--bind", host_dir, workdir]
    # The private /tmp hides any part of the Python installation below /tmp (a checkout or
    # virtual environment there): bind those parts again on top of it.
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
    return workdir, list(setup.bwrap_argv) + wd_args, "/"


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
    try:
        out, err, killed_for = _pump(proc, start + timeout, nproc_limit if watch_nproc else None,
                                     max_output_bytes, tail_bytes)
        if proc.poll() is None:
            _kill_tree(proc.pid)
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            rc = proc.wait()
    finally:
        _kill_tree(proc.pid)
        if uid is not None and setup.kind == "rlimits":
            _kill_uid(uid)
        for f in (proc.stdout, proc.stderr):
            try:
                f.close()
            except OSError:
                pass
    status, note = _verdict(killed_for, rc, err, setup.kind, timeout, max_output_bytes, nproc_limit)
    return SandboxResult(status, rc, out, err, time.monotonic() - start, setup.kind, note)


def _pump(proc, deadline: float, nproc_watch: int | None, max_output_bytes: int, tail_bytes: int):
    """Read the program's stdout and stderr until both close (or 1 s after it exits), killing it
    at the deadline, beyond the output cap, or above ``nproc_watch`` processes (the watchdog of
    root without a uid of its own). Returns (stdout tail, stderr tail, what it was killed for)."""
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    bufs = {out_fd: bytearray(), err_fd: bytearray()}
    total, killed_for, exited_at = 0, None, None
    next_watch = time.monotonic()
    open_fds = set(bufs)
    sel = selectors.DefaultSelector()
    for fd in open_fds:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    try:
        while open_fds:
            now = time.monotonic()
            if killed_for is None and now >= deadline:
                killed_for = "timeout"
                _kill_tree(proc.pid)
            if exited_at is None and proc.poll() is not None:
                exited_at = now
                _kill_tree(proc.pid)  # whatever the runner left behind (daemons holding our pipes) goes now
            if exited_at is not None and now - exited_at > 1.0:
                break
            if nproc_watch is not None and killed_for is None and now >= next_watch:
                next_watch = now + 0.02
                if len(_tree(proc.pid)) > nproc_watch + 4:
                    killed_for = "nproc"
                    _kill_tree(proc.pid)
            wait = 0.02 if (nproc_watch is not None or exited_at is not None) else 0.25
            wait = max(0.0, min(wait, deadline - now)) if killed_for is None else 0.05
            for key, _ in sel.select(wait):
                try:
                    chunk = os.read(key.fd, 1 << 16)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    sel.unregister(key.fd)
                    open_fds.discard(key.fd)
                    continue
                total += len(chunk)
                buf = bufs[key.fd]
                buf += chunk
                if len(buf) > tail_bytes:
                    del buf[: len(buf) - tail_bytes]
                if total > max_output_bytes and killed_for is None:
                    killed_for = "output"
                    _kill_tree(proc.pid)
    finally:
        sel.close()
    return _tail(bufs[out_fd]), _tail(bufs[err_fd]), killed_for


def _verdict(killed_for, rc, err: str, kind: str, timeout, max_output_bytes, nproc_limit) -> tuple[str, str]:
    """(status, note) of a finished program."""
    if killed_for == "timeout":
        return "timeout", f"killed after {timeout:g}s of wall clock"
    if killed_for == "output":
        return "failed", f"killed: output exceeded {max_output_bytes} bytes"
    if killed_for == "nproc":
        return "failed", f"killed: more than {nproc_limit} processes"
    if rc == RUNNER_ERROR_CODE and RUNNER_ERROR_MARK in err:
        return "error", "the sandbox runner failed"
    if kind == "bubblewrap" and rc == 1 and err.startswith("bwrap:"):
        return "error", "bubblewrap could not set up the sandbox"
    if rc == 128 + signal.SIGXCPU or rc == -signal.SIGXCPU:
        return "timeout", "CPU time limit"
    if rc == 0:
        return "passed", ""
    note = ""
    if rc is not None and rc > 128:
        try:
            note = f"program died of {signal.Signals(rc - 128).name}"
        except ValueError:
            pass
    elif rc is not None and rc < 0:
        note = "the runner was killed"
    return "failed", note
