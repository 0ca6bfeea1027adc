"""vskip commands as child processes, side by side, until a deadline: how the long studies
(``vskip fullscale``, ``vskip calibrate-online sweep``) run their pieces. A piece stopped at the
deadline loses at most the prompt each process was decoding, and the same step resumes it."""

from __future__ import annotations

import datetime as dt
import shlex
import signal
import subprocess
import sys
import time
from typing import Protocol, Sequence

#: a piece is not started with less than this many seconds left before the deadline
MARGIN_S = 60


class Runner(Protocol):
    """Runs vskip commands (each an argument list without ``vskip``) side by side and waits for
    all of them. ``timed``: stopped at the deadline, if there is one; ``quiet``: stdout dropped.
    True when every command finished, False when the deadline stopped them (or came too close to
    start them); a command that fails raises."""

    def __call__(self, commands: Sequence[Sequence[str]], *, timed: bool = False, quiet: bool = False) -> bool: ...


def deadline(text: str | None, now: dt.datetime | None = None) -> float | None:
    """``HH:MM`` (today, even if already past) or ``YYYY-MM-DD HH:MM`` as a ``time.time()``;
    None without one."""
    if not text:
        return None
    now = now or dt.datetime.now()
    try:
        if len(text) <= 5:
            h, m = (int(x) for x in text.split(":"))
            at = now.replace(hour=h, minute=m, second=0, microsecond=0)
        else:
            at = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--until takes a local time HH:MM or YYYY-MM-DD HH:MM, got {text!r}") from None
    return at.timestamp()


class Processes:
    """The :class:`Runner` of the command line: each command is ``python -m vskip ...`` with this
    interpreter; at the deadline each still running gets SIGTERM (what ``timeout -s TERM`` sends):
    a run directory keeps every prompt it finished."""

    def __init__(self, until: float | None = None, what: str = "vskip", margin: float = MARGIN_S):
        self.until, self.what, self.margin = until, what, margin

    def left(self) -> float:
        return float("inf") if self.until is None else self.until - time.time()

    def __call__(self, commands, *, timed: bool = False, quiet: bool = False) -> bool:
        if timed and self.left() <= self.margin:
            print(f"{self.what}: the deadline has passed", file=sys.stderr)
            return False
        procs = [(c, subprocess.Popen([sys.executable, "-m", "vskip", *map(str, c)],
                                      stdout=subprocess.DEVNULL if quiet else None)) for c in commands]
        stopped, failed = False, []
        for c, p in procs:
            while True:
                try:
                    rc = p.wait(timeout=max(1.0, self.left()) if timed and self.until is not None else None)
                    break
                except subprocess.TimeoutExpired:
                    stopped = True
                    for _, q in procs:
                        if q.poll() is None:
                            q.send_signal(signal.SIGTERM)
            if rc != 0 and not (stopped and rc in (-signal.SIGTERM, 128 + signal.SIGTERM)):
                failed.append(f"`vskip {shlex.join(map(str, c))}` exited {rc}")
        if failed:
            raise RuntimeError("; ".join(failed))
        return not stopped
