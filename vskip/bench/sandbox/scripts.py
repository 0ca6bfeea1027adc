"""The programs the sandbox runs before the untrusted one: the runner (limits, uid, fork) and the
namespaces jail (a read-only root, then no privileges)."""

from __future__ import annotations

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
# working directory (no program runs from either) and a few device nodes, and no /proc, pivots into
# it and detaches the old root. Then it gives up root: to a fresh uid (when the host is root; the runner switches), or to
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

def write(path, text, dir_fd=None):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    with open(fd, "w") as f:
        f.write(text)

try:
    os.umask(0o022)
    mount(None, "/", None, REC | PRIVATE)
    root = cfg["root"]
    mount("tmpfs", root, "tmpfs", NOSUID | NODEV, "size=4m,mode=0755")
    size = "size=%d" % cfg["disk_bytes"]
    for d, mode in (("/tmp", "1777"), (cfg["workdir"], "0777")):
        os.makedirs(root + d, exist_ok=True)
        mount("tmpfs", root + d, "tmpfs", NOSUID | NODEV | NOEXEC, size + ",mode=" + mode)
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
    procfd = None
    if cfg["nest_user"]:  # a /proc outside the new root, reached by a descriptor only, to map the uid
        os.makedirs(cfg["proc"], exist_ok=True)
        mount("proc", cfg["proc"], "proc", NOSUID | NODEV | NOEXEC)
        procfd = os.open(cfg["proc"], os.O_RDONLY | os.O_DIRECTORY)
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
        write("self/setgroups", "deny", procfd)
        write("self/uid_map", "65534 0 1", procfd)
        write("self/gid_map", "65534 0 1", procfd)
        os.close(procfd)
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
