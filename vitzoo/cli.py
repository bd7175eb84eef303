"""The `vitzoo` command. Each subcommand lives in `vitzoo/commands/<name>.py` and exposes
`add_parser(subparsers)`, which registers its arguments and sets `func(args) -> int`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import vitzoo.commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitzoo", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"vitzoo {__import__('vitzoo').__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(vitzoo.commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"vitzoo.commands.{info.name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, RuntimeError) as exc:  # user errors (a path that is a file, ...): a message, not a traceback
        print(f"vitzoo {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
