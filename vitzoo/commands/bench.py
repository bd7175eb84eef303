"""`vitzoo bench LIST ...`: the ablation benchmarks of a checkout, `python -m benchmarks LIST ...`
run by this interpreter from the caller's directory; the results go to runs/bench unless `--out`
or `--committed` (the checkout's benchmarks/results/). The benchmarks are no part of the installed
package: they live beside it in the repository.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

AS_VITZOO_BENCH = ("import sys; from benchmarks.__main__ import main; "
                   "sys.exit(main(prog='vitzoo bench'))")


def add_parser(sub: argparse._SubParsersAction) -> None:
    # every argument, --help included, is the benchmarks' own: no prefix character is this parser's
    p = sub.add_parser("bench", help="run the paper's ablations (python -m benchmarks; needs a "
                                     "checkout)", add_help=False, prefix_chars="\0")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)


def run(args) -> int:
    root = Path(__file__).resolve().parents[2]  # the checkout vitzoo was installed from (editable)
    if not (root / "benchmarks" / "__main__.py").is_file():
        raise FileNotFoundError("the benchmarks are not installed with vitzoo: they live in its "
                                "repository; clone it, `pip install -e '.[bench]'` there, and "
                                "run `vitzoo bench` in it")
    # the checkout first on the child's path; -P (3.11+): not the caller's directory, where
    # another `benchmarks` could stand
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    command = [sys.executable, *safe, "-c", AS_VITZOO_BENCH, *(args.args or ["--help"])]
    sys.stdout.flush()
    with subprocess.Popen(command, env={**os.environ, "PYTHONPATH": path}) as child:
        try:
            code = child.wait()
        except KeyboardInterrupt:  # the benchmarks had it too: they stop and say so
            code = child.wait()
    if code != 0:  # the benchmarks said why; their status is the command's
        raise SystemExit(code if code > 0 else 128 - code)
    return 0
