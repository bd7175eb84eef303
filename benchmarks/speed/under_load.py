"""The fast path beside a competing process: does `for_inference(model)` degrade no worse than eager
when another process is busy on one of the cores?

    python -m benchmarks.speed.under_load [--depth 4] [--batch 4] [--reps 5] [--out DIR]

One ViT-S/16 (at `--depth` layers: small enough to compile in a minute on 2 cores), in the precision
the CPU computes fastest (`vitzoo.precision.fastest`), timed in two phases, alone and beside a
competitor (a busy loop pinned to the last core, as another user's process would be), each
contestant's calls interleaved with the others' so that the machine's load hits all alike:
`eager` (the plain model), `fast eager` (`for_inference(model)`: weights cast once) and `compiled`
(`for_inference(model, compile=True)`).

Recorded with the CPU, threads, `OMP_WAIT_POLICY` and the load average before and after each phase, in
benchmarks/results/speed/under_load.json and under_load.md (one measurement each time, not a store).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import vitzoo
from benchmarks.machine import environment
from benchmarks.suite import RESULTS, markdown_table
from vitzoo import precision
from vitzoo.argvalues import ArgumentParser
from vitzoo.inference import for_inference
from vitzoo.io import write_text

OUT = RESULTS / "speed"


def competitor(core: int) -> subprocess.Popen:
    """A busy loop on `core` that ends with this process (it watches its parent)."""
    code = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile os.getppid() == {os.getpid()}:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def interleaved(calls: dict[str, Callable[[], object]], reps: int) -> dict[str, dict[str, float]]:
    """Seconds per call of each contestant, calls interleaved (the order rotated each repetition)."""
    for call in calls.values():
        call()
    names, times = list(calls), {name: [] for name in calls}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "max_s": max(t)} for name, t in times.items()}


def phase(model: torch.nn.Module, dtype: torch.dtype, x: torch.Tensor, reps: int, loaded: bool) -> dict:
    hog = competitor(os.cpu_count() - 1) if loaded else None
    try:
        time.sleep(1.0 if loaded else 0.0)
        load_before = os.getloadavg()[0]
        eager_fast = for_inference(copy.deepcopy(model), dtype)
        compiled = for_inference(copy.deepcopy(model), dtype, compile=True)
        mixed = None if dtype == torch.float32 else dtype

        def eager():
            with torch.inference_mode(), precision.autocast(x.device, mixed):
                model(x)

        timings = interleaved({"eager": eager, "fast eager": lambda: eager_fast(x),
                               "compiled": lambda: compiled(x)}, reps)
        return {"loaded": loaded, "load_before": load_before, "load_after": os.getloadavg()[0],
                "timings": timings}
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


def report(record: dict) -> str:
    rows = []
    for p in record["phases"]:
        base = p["timings"]["eager"]["median_s"]
        for name, t in p["timings"].items():
            rows.append(["beside a busy process" if p["loaded"] else "alone", f"{p['load_before']:.1f} / {p['load_after']:.1f}",
                         name, f"{record['batch'] / t['median_s']:.2f}", f"{record['batch'] / t['max_s']:.2f}-{record['batch'] / t['min_s']:.2f}",
                         f"{base / t['median_s']:.2f}x"])
    env = record["environment"]
    return "\n\n".join([
        "# The fast path under load", f"`python -m benchmarks.speed.under_load` ({record['command']}), {env['date']}, commit "
        f"{env['commit']}: {record['model']} at batch {record['batch']} in {record['dtype']} ({record['choice']}); "
        f"{env['cpu']} ({', '.join(env['cpu_flags'])}), {env['threads']} threads, OMP_WAIT_POLICY={record['omp_wait_policy']}, "
        f"{record['reps']} interleaved repetitions per phase. The load average (1 min) before and after each phase "
        "counts the other users of this shared machine too.",
        markdown_table(["phase", "load", "contestant", "images/s", "min-max", "over eager"], rows),
    ]) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m benchmarks.speed.under_load", description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=4, help="ViT-S/16's layers (12: the paper's)")
    parser.add_argument("--batch", type=int, default=4, help="images per call")
    parser.add_argument("--reps", type=int, default=5, help="interleaved repetitions per phase")
    parser.add_argument("--out", type=Path, default=OUT, help="where under_load.json and under_load.md go")
    return parser


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    torch.manual_seed(0)
    model = vitzoo.create("vit_s16", depth=args.depth).eval()
    x = torch.randn(args.batch, 3, 224, 224)
    choice = precision.fastest("cpu")
    phases = [phase(model, choice.dtype, x, args.reps, loaded) for loaded in (False, True)]
    record = {"model": f"vit_s16 (depth {args.depth})", "batch": args.batch, "dtype": precision.NAMES[choice.dtype],
              "choice": str(choice), "reps": args.reps, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset"),
              "command": " ".join(["python -m benchmarks.speed.under_load", *(argv if argv is not None else sys.argv[1:])]).strip(),
              "environment": environment("cpu"), "phases": phases}
    write_text(args.out / "under_load.json", json.dumps(record, indent=1) + "\n")
    write_text(args.out / "under_load.md", report(record))
    print(report(record))
    return args.out


if __name__ == "__main__":
    main()
