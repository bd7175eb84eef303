"""`vitzoo bench LIST ...`: the ablation benchmarks of a checkout (same as `python -m benchmarks`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    # every argument, --help included, is the benchmarks' own: no prefix character is this parser's, so
    # nothing is read as an option here (argparse.REMAINDER alone refuses a leading "--help")
    p = sub.add_parser("bench", help="run the paper's ablations (python -m benchmarks; needs a checkout)",
                       add_help=False, prefix_chars="\0")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)


def run(args) -> int:
    checkout = Path(__file__).resolve().parents[2]
    if not (checkout / "benchmarks" / "__main__.py").exists():
        raise FileNotFoundError("the benchmarks live in the vitzoo repository: run `vitzoo bench` from a checkout")
    sys.path.insert(0, str(checkout))
    from benchmarks.__main__ import main

    return main(args.args or ["--help"])
