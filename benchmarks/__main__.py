"""python -m benchmarks LIST [--scale quick|main|cpu|paper] [--workers N] [--dry-run] ...

LIST: ablation names (see benchmarks/ablations/), `all` (every ablation), or `speed`. Scales are in
benchmarks/scales.py: `main` is the main job's (Table 8's headline in minutes), `cpu` trains every
ablation to where architecture matters on a 2-core CPU (hours), `paper` is the paper's (GPUs),
`quick` is for tests (`--quick` is short for it). `--workers 2` trains two runs at once (one CPU
thread each), which suits a 2-core machine. `--dry-run` prints the plan and its estimated time, and
trains nothing.

Results go to benchmarks/results/<ablation>/: results.json (every run, its settings and environment),
findings.json (the verdicts), README.md (the table beside the paper's numbers, each finding judged by
one rule), PNG figures. Runs whose results exist are skipped, so an interrupted suite continues.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
import time
from pathlib import Path

from benchmarks import plan as planning
from benchmarks.ablations import ABLATIONS
from benchmarks.figures import MATPLOTLIB_MISSING
from benchmarks.scales import SCALES, get_scale
from benchmarks.spec import Ablation, Scale, report
from benchmarks.suite import RESULTS, ResultStore, execute
from benchmarks.verdict import RULE
from vitzoo.io import write_text


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="+", help="ablations to run: " + ", ".join(ABLATIONS) + ", all, or speed")
    parser.add_argument("--scale", choices=tuple(SCALES), default="cpu")
    parser.add_argument("--quick", action="store_true", help="the same as --scale quick (seconds per run; for tests)")
    parser.add_argument("--data", default=None, help="dataset for --scale paper: an ImageFolder directory, cifar10, cifar100")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results root (default benchmarks/results)")
    parser.add_argument("--workers", type=int, default=1,
                        help="training runs measured at once, in separate processes sharing the CPU threads "
                             "(2 on a 2-core CPU: small models gain about 1.5x); timing ablations always use one")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (runs, FLOPs, estimated minutes); train nothing")
    parser.add_argument("--gpus", type=int, default=8, help="with --dry-run on a GPU that is not here: how many")
    parser.add_argument("--gpu-tflops", type=float, default=planning.STATED_GPU_TFLOPS,
                        help="with --dry-run on a GPU that is not here: training TFLOP/s per GPU")
    parser.add_argument("--report-only", action="store_true",
                        help="write the tables, figures and verdicts from the results measured so far; train nothing")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.scale = "quick"
    names = list(ABLATIONS) if "all" in args.names else args.names
    unknown = [n for n in names if n not in ABLATIONS and n != "speed"]
    if unknown:
        parser.error(f"unknown ablation {unknown[0]!r}; choose from {', '.join(ABLATIONS)}, all, speed")
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if not args.dry_run and importlib.util.find_spec("matplotlib") is None:  # said before the training, not after
        parser.error(MATPLOTLIB_MISSING)
    try:
        # a dry run of the paper's scale needs no data: ImageNet-1k's size is assumed (benchmarks/plan.py)
        data = args.data or ("imagenet" if args.dry_run and args.scale == "paper" else None)
        args.scale_settings = get_scale(args.scale, data, args.data_dir)
    except ValueError as exc:
        parser.error(str(exc))
    args.names = names
    return args


def settings_line(scale: Scale, records: list[dict]) -> str:
    seen = lambda field: ", ".join(sorted({str(r.get(field, "?")) for r in records})) or "?"  # noqa: E731
    dates = sorted(r["date"] for r in records if "date" in r)
    when = f"measured {dates[0][:10]} to {dates[-1][:10]}" if dates else "dates not recorded"
    return (f"Settings: `--scale {scale.name}`; {len(records)} runs, {when}; device {seen('device')}; "
            f"CPU {seen('cpu')}; threads per run {seen('threads')}; torch {seen('torch')}; commit {seen('commit')}. "
            f"Every option of every run is in `results.json`; the verdicts in `findings.json`.")


def run_ablation(spec: Ablation, scale: Scale, store: ResultStore, args: argparse.Namespace) -> str:
    out = args.out / spec.name
    measure = spec.measure
    if measure is None:
        from benchmarks.training import measure
    workers = args.workers if spec.parallel else 1  # an ablation that times things has the machine to itself
    runs = spec.runs(scale)
    if args.report_only:  # the runs measured so far, e.g. of a suite still running
        records = [{**store.get(run.key), "label": run.label, "group": run.group} for run in runs if store.get(run.key)]
        if not records:
            return f"(no results of {spec.name} at --scale {scale.name} in {out} yet)"
    else:
        records = execute(runs, functools.partial(measure, device=args.device), store, args.device,
                          quiet=args.quiet, workers=workers)
    if spec.report is not None:
        body, verdicts = spec.report(records, out), []
    else:
        body, verdicts = report(spec, records, out)
    write_text(out / "findings.json", json.dumps({"rule": RULE, "scale": scale.name, "findings": verdicts}, indent=1) + "\n")
    missing = len(runs) - len(records)
    partial = (f"**Incomplete: {len(records)} of {len(runs)} runs measured** (the rest resume with "
               f"`python -m benchmarks {spec.name} --scale {scale.name}`); cells without all their seeds are "
               "judged on those they have.\n\n") if missing else ""
    write_text(out / "README.md", f"# {spec.title}\n\n{partial}{settings_line(scale, records)}\n\n{body}\n")
    return body


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    scale = args.scale_settings
    start = time.perf_counter()
    specs = [ABLATIONS[name] for name in args.names if name in ABLATIONS]
    stores = {spec.name: ResultStore(args.out / spec.name) for spec in specs}
    plans = {spec.name: planning.plan_ablation(spec, scale, {r["key"] for r in stores[spec.name].runs}, args.device,
                                               args.workers, args.gpus, args.gpu_tflops) for spec in specs}
    print(planning.describe(list(plans.values()), scale, args.device, args.workers, args.gpus, args.gpu_tflops), flush=True)
    if args.dry_run:
        return 0
    if args.report_only:
        args.names = [n for n in args.names if n != "speed"]
    for i, name in enumerate(args.names, 1):
        left = sum(plans[n].minutes for n in args.names[i - 1:] if n in plans)
        print(f"\n== [{i}/{len(args.names)}] {name}" + (f", about {left:.0f} min left (estimated)" if name in plans else ""),
              flush=True)
        if name == "speed":
            from benchmarks.speed import measure

            measure.main(quick=args.scale == "quick", out=args.out / "speed", device=args.device)
            print((args.out / "speed" / "README.md").read_text())
            continue
        spec = ABLATIONS[name]
        print(run_ablation(spec, scale, stores[name], args), flush=True)
        print(f"\nResults, figures and README in {args.out / name}", flush=True)
    print(f"\n== done in {(time.perf_counter() - start) / 60:.1f} min; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
