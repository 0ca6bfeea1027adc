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
    best effort: as root, nothing stops it). The runner drops to a fresh uid, which needs root
    and a Python installation any uid can read; where it cannot, ``rlimits`` refuses.
``"rlimits-own-uid"``
    The same limits as the scorer's own uid (root included), only when asked for by this name;
    as root a pids cgroup (when root may create one) and a process-count watchdog bound the
    number of processes, since RLIMIT_NPROC does not apply to root.

Nothing here imports torch.
"""

from __future__ import annotations

from .choice import KINDS, SandboxUnavailable, check_isolation, run_program, sandbox_info, sandbox_kind
from .run import SandboxResult
from .scripts import PROGRAM_NAME

__all__ = ["SandboxResult", "run_program", "sandbox_kind", "sandbox_info", "check_isolation", "SandboxUnavailable",
           "PROGRAM_NAME", "KINDS"]
