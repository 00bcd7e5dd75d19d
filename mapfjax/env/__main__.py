"""Command line: `python -m mapfjax.env {verify,solve,label,generate,benchmark,demo,render} ...`.

Exit status: 0 success, 1 `verify` found missing answers or a wrong label, 2 bad input (one line
on stderr naming the file, line, flag or field, the value and what is allowed).
"""

from __future__ import annotations

import argparse
import sys

from mapfjax.env.cli import COMMANDS


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block) and exit status 2."""

    def error(self, message):
        self.exit(2, f"error: {self.prog}: {message}\n")


def main(argv=None) -> int:
    parser = _Parser(prog="python -m mapfjax.env", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (setup, _) in COMMANDS.items():
        setup(sub.add_parser(name, help=setup.__doc__, description=setup.__doc__))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][1](args) or 0
    except BrokenPipeError:
        return 0
    except (ValueError, OSError) as e:  # user errors: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
