"""The entry point of the ``vskip`` command: parse (:mod:`vskip.commands`), run the command, and turn
every failure into one line and an exit status."""

from __future__ import annotations

import shlex
import sys

from . import environment
from .commands import build_parser


#: failures caused by what the user gave (exit 2); anything else is a failure at run time (exit 1)
BAD_INPUT = (ValueError, LookupError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
             PermissionError, UnicodeError)


def describe(e: BaseException) -> str:
    """One line saying what failed, naming the file when an OS error carries one."""
    if isinstance(e, OSError) and e.filename is not None:
        what = e.strerror or type(e).__name__
        return f"{what}: {e.filename}"
    if isinstance(e, MemoryError):
        return "out of memory"
    if isinstance(e, KeyError) and e.args:
        return f"missing key {e.args[0]!r}"
    text = str(e).strip() or type(e).__name__
    first = text.splitlines()[0]
    ours = type(e).__module__.startswith("vskip")  # vskip's own errors say what failed already
    return first if ours or isinstance(e, (*BAD_INPUT, OSError)) else f"{type(e).__name__}: {first}"


def main(argv=None) -> int:
    """Every failure becomes one line on stderr: exit 2 for bad input, 1 for a failure at run
    time, 130 when interrupted. ``--debug`` (anywhere) or ``VSKIP_DEBUG=1`` shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or environment.debug()
    argv = [a for a in argv if a != "--debug"]
    args = build_parser().parse_args(argv)
    args.argv = argv[1:]  # the command as given, recorded by run directories and plans
    args.command_line = shlex.join(["vskip", *argv])
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print("vskip: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the one error boundary of the command line
        if debug:
            raise
        print(f"vskip: error: {describe(e)}", file=sys.stderr)
        if not isinstance(e, BAD_INPUT):
            print("vskip: (run again with --debug for the traceback)", file=sys.stderr)
        return 2 if isinstance(e, BAD_INPUT) else 1


if __name__ == "__main__":
    sys.exit(main())
