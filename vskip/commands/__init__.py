"""The command line: one module per subcommand, each holding its flags (``register``) and its handler
(``cmd_*``); the flag groups several commands share live in :mod:`vskip.commands.flags`.

Handlers import the library when they run, so building the parser (``vskip --help``) imports
neither torch nor numpy. The library never imports this package; :mod:`vskip.cli` runs it.
"""

from __future__ import annotations

import argparse
import sys

from . import compare, conditioned, drafter, expect, fullscale, generate, plan, predictors, report, run, score, serve, sweep

#: in the order ``vskip --help`` lists them
COMMANDS = (run, generate, serve, compare, score, plan, expect, sweep, report, predictors, drafter, conditioned, fullscale)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one clear line, no usage dump
        print(f"vskip: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="vskip", description="Speculative diffusion decoding with verifier skipping.",
               epilog="Errors print one line; --debug (anywhere) or VSKIP_DEBUG=1 prints the traceback.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    return p
