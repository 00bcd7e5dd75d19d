"""Command line: `python -m mapfjax.env {verify,solve,generate,benchmark,demo,render} ...`."""

from __future__ import annotations

import argparse
import sys

from mapfjax.env.cli import COMMANDS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mapfjax.env", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (setup, _) in COMMANDS.items():
        setup(sub.add_parser(name, help=setup.__doc__))
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][1](args) or 0
    except (ValueError, FileNotFoundError) as e:  # user errors: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
