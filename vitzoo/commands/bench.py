"""`vitzoo bench LIST ...`: the ablation benchmarks of a checkout (`python -m benchmarks`), whose
results go to runs/bench in the caller's directory unless `--out` or `--committed` (the checkout's
benchmarks/results/).

The benchmarks are no part of the installed package: they live beside it in the repository, with
their committed results. The command runs them as `python -m benchmarks LIST ...` with this
interpreter, in a child process that finds the checkout through its own import path (this process's
stays as it was), from the caller's directory (a relative `--out` or `--data` means what it would
mean to `python -m benchmarks`).
"""

from __future__ import annotations

import argparse
import codecs
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO


BENCHMARKS_AS_VITZOO_BENCH = ("import sys; from benchmarks.__main__ import main; "
                              "sys.exit(main(prog='vitzoo bench'))")


def add_parser(sub: argparse._SubParsersAction) -> None:
    # every argument, --help included, is the benchmarks' own: no prefix character is this parser's,
    # so nothing is read as an option here (argparse.REMAINDER alone refuses a leading "--help")
    p = sub.add_parser("bench", help="run the paper's ablations (python -m benchmarks; needs a "
                                     "checkout)",
                       add_help=False, prefix_chars="\0")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)


def checkout() -> Path:
    """The repository this vitzoo was installed from (editable), which holds `benchmarks/`."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "__main__.py").is_file():
        raise FileNotFoundError(
            "the benchmarks are not installed with vitzoo (no benchmarks/ beside "
            f"{root / 'vitzoo'}): they live in its repository. Clone it, install vitzoo from the "
            "checkout (pip install -e '.[bench]'), and run `vitzoo bench` (or `python -m "
            "benchmarks`) there")
    return root


def run(args) -> int:
    root = checkout()
    # the checkout first on the child's import path; -P (Python 3.11+): not the caller's directory,
    # where another `benchmarks` could stand
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    # `python -m benchmarks` as `vitzoo bench`: its usage says so, and its results go to runs/bench
    # unless asked (benchmarks/__main__.py)
    code = relayed([sys.executable, *safe_path, "-c", BENCHMARKS_AS_VITZOO_BENCH,
                    *(args.args or ["--help"])], env)
    if code != 0:  # the benchmarks have said why; their status (2: a usage error) is the command's
        raise SystemExit(code if code > 0 else 128 - code)
    return 0


def relayed(command: list[str], env: dict[str, str]) -> int:
    """Run `command`; its output goes where this process's goes: straight to a file or terminal (a
    terminal stays one, so progress bars draw), or, where this process's streams are no files
    (captured by a notebook or a test), copied into them as it comes. Returns the exit status."""
    streams = (sys.stdout, sys.stderr)
    for stream in streams:
        stream.flush()
    targets = [_fileno(stream) for stream in streams]
    if None in targets:  # copied: as it is written, in the encoding it is read in
        env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONIOENCODING": "utf-8"}
    pipes = [subprocess.PIPE if target is None else target for target in targets]
    with subprocess.Popen(command, env=env, stdout=pipes[0], stderr=pipes[1]) as child:
        copies = [threading.Thread(target=_copy, args=(pipe, stream), daemon=True)
                  for pipe, stream in zip((child.stdout, child.stderr), streams)
                  if pipe is not None]
        for copy in copies:
            copy.start()
        try:
            for copy in copies:
                copy.join()
            return child.wait()
        except KeyboardInterrupt:  # the benchmarks had the same interrupt: they stop and say so
            return child.wait()


def _fileno(stream: IO[str]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return None


def _copy(pipe: IO[bytes], stream: IO[str]) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    while chunk := pipe.read1(65536):
        stream.write(decoder.decode(chunk))
        stream.flush()
    stream.write(decoder.decode(b"", final=True))
