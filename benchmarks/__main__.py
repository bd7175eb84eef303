"""python -m benchmarks LIST [--scale quick|main|cpu|rehearsal|gpu|paper] [--dry-run] ...

LIST: ablations (benchmarks/ablations/), `all`, `speed`, `loader`; or `gpu-check` alone. A run is
an ablation's cell at the scale with a seed, and is done when its record exists: an interrupted
suite continues, and a run resumes from its checkpoint. Runs go to a process pool (`--workers`),
PyTorch's elastic launcher (`--gpus-per-run`) or SLURM (`--launcher slurm`); `--dry-run` prints
the plan (runs, FLOPs, minutes) and writes nothing; `--report-only` writes the tables, figures
and verdicts of the runs measured so far.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import sys
import time
from pathlib import Path

import torch

from benchmarks import plan as planning
from benchmarks.ablations import ABLATIONS
from benchmarks.figures import MATPLOTLIB_MISSING
from benchmarks.runner import assign, execute, records
from benchmarks.scales import SCALES, get_scale
from benchmarks.slurm import MEM_BASE_GB, MEM_PER_LOADER_WORKER_GB, SIGNAL_DELAY_S, SlurmOptions
from benchmarks.spec import Ablation, Scale, report
from benchmarks.suite import NUMERICS_VERSION, RESULTS, ResultStore, numerics_of
from benchmarks.verdict import RULE
from vitzoo.argvalues import ArgumentParser
from vitzoo.io import write_text

PROG = "python -m benchmarks"
REHEARSAL_OUT = Path("runs") / "rehearsal"  # never mixed with the committed results
BENCH_OUT = Path("runs") / "bench"  # `vitzoo bench`'s, from any directory, unless --committed
NOT_ABLATIONS = ("speed", "loader")
SLURM_FLAGS = ("nodes", "gpus_per_node", "partition", "account", "time_limit_min",
               "cpus_per_task", "mem_per_task_gb", "signal_delay_s", "no_wait")


def count(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return int(text)


def number(text: str) -> float:
    if not 0 < float(text) < math.inf:
        raise argparse.ArgumentTypeError(f"must be positive (a finite number), got {text}")
    return float(text)


def build_parser(prog: str = PROG) -> ArgumentParser:
    """The command line of `python -m benchmarks`, or of `vitzoo bench` (results in runs/bench)."""
    committed = RESULTS.relative_to(RESULTS.parents[1])
    p = ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="+", help=f"{', '.join(ABLATIONS)}, all, speed or loader")
    p.add_argument("--scale", choices=tuple(SCALES), default="cpu",
                   help="how big the runs are (benchmarks/scales.py; default cpu)")
    p.add_argument("--seeds", type=count, help="seeds per cell instead of the scale's")
    p.add_argument("--data", help="the dataset of --scale paper or gpu: an ImageFolder directory, "
                   "its shards (`vitzoo shard`), cifar10 or cifar100")
    p.add_argument("--device", default="cpu", help="cpu, cuda (each run its own GPUs), or auto")
    p.add_argument("--out", type=Path, help=f"results root (default "
                   f"{committed if prog == PROG else BENCH_OUT}; the rehearsal's {REHEARSAL_OUT})")
    p.add_argument("--committed", action="store_true",
                   help=f"write into the checkout's committed results, {committed}/")
    p.add_argument("--workers", type=count, default=1, help="CPU: runs at once, a process each")
    p.add_argument("--gpus-per-run", type=count, help="CUDA: GPUs of a run, one process each "
                   "(default: every visible GPU); the GPUs are cut into sets of this size")
    p.add_argument("--launcher", choices=("local", "slurm"), default="local",
                   help="local (a process pool or PyTorch's elastic launcher) or slurm (submitit)")
    slurm = p.add_argument_group("SLURM (--launcher slurm)")
    slurm.add_argument("--nodes", type=count, help="nodes of each run's job (default 1)")
    slurm.add_argument("--gpus-per-node", type=count, help="GPUs (= tasks) per node (default 8)")
    slurm.add_argument("--partition", help="default: the cluster's default partition")
    slurm.add_argument("--account", help="the SLURM account to charge")
    slurm.add_argument("--time-limit-min", type=number,
                       help="each job's time limit (default: its planned time x 1.5, >= 10 min)")
    slurm.add_argument("--cpus-per-task", type=count,
                       help="CPUs of each task (default: the run's loader workers + 2)")
    slurm.add_argument("--mem-per-task-gb", type=number, help=f"memory of each task (default "
                       f"{MEM_BASE_GB:g} GB + {MEM_PER_LOADER_WORKER_GB:g} GB per loader worker)")
    slurm.add_argument("--signal-delay-s", type=count, help="USR2 this long before the limit, to "
                       f"end an evaluation and checkpoint (default {SIGNAL_DELAY_S})")
    slurm.add_argument("--no-wait", action="store_true",
                       help="submit and return; the same command again collects the results")
    p.add_argument("--dry-run", action="store_true", help="print the plan; train nothing")
    p.add_argument("--gpus", type=count, default=8, help="planning GPUs not here: GPUs per node")
    p.add_argument("--gpu-tflops", type=number, default=planning.STATED_GPU_TFLOPS,
                   help="the plan's training TFLOP/s per GPU")
    p.add_argument("--report-only", action="store_true",
                   help="write the tables, figures and verdicts of the results so far")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def parse(argv: list[str] | None, prog: str = PROG) -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    names = list(ABLATIONS) if "all" in args.names else args.names
    if unknown := [n for n in names if n not in ABLATIONS and n not in NOT_ABLATIONS]:
        parser.error(f"unknown ablation {unknown[0]!r}; choose from {', '.join(ABLATIONS)}, all, "
                     "speed, loader (gpu-check alone)")
    ignored = ["--" + f.replace("_", "-") for f in SLURM_FLAGS if getattr(args, f)]
    if ignored and args.launcher != "slurm":
        parser.error(f"{', '.join(ignored)}: read by --launcher slurm only")
    if args.launcher == "slurm" and args.device == "auto":
        parser.error("--device auto would be decided on this login node: say --device cuda or cpu")
    if not args.dry_run and importlib.util.find_spec("matplotlib") is None:
        parser.error(MATPLOTLIB_MISSING)
    if args.committed and args.out is not None:
        parser.error(f"--committed writes into {RESULTS}, --out into {args.out}: give one")
    if args.out is None:
        args.out = (REHEARSAL_OUT if args.scale == "rehearsal" and not args.committed
                    else RESULTS if args.committed or prog == PROG else BENCH_OUT)
    # a dry run of the paper's scales assumes ImageNet-1k; the rehearsal writes its own data
    data = args.data or ("imagenet" if args.dry_run and args.scale in ("paper", "gpu") else None)
    if args.scale == "rehearsal" and data is None:
        data = str((args.out / "data" / "imagenet").resolve())
    try:
        scale = get_scale(args.scale, data)
        args.scale_settings = dataclasses.replace(scale, seeds=args.seeds or scale.seeds)
        shares = [t["batch_size"] // (t.get("micro_batch") or 1) for n in names
                  if n in ABLATIONS and ABLATIONS[n].parallel for run in ABLATIONS[n].runs(scale)
                  for t in planning.trainings(run)]
        args.assignment = assign(
            args.device, args.launcher, gpus_per_run=args.gpus_per_run, workers=args.workers,
            processes_per_run=scale.processes_per_run, gpus=args.gpus_per_node or args.gpus,
            nodes=args.nodes or 1, share=math.gcd(*shares))
    except ValueError as exc:
        parser.error(str(exc))
    gpus_here = torch.cuda.is_available() or args.dry_run or args.launcher == "slurm"
    if args.assignment.device == "cuda" and not gpus_here:
        parser.error(f"--device {args.device}: no CUDA GPU is visible here (--dry-run plans for "
                     "GPUs that are not here)")
    args.names = names
    return args


def settings_line(scale: Scale, runs: list[dict]) -> str:
    def seen(field: str) -> str:
        return ", ".join(sorted({str(r.get(field, "?")) for r in runs})) or "?"

    dates = sorted(r["date"] for r in runs if "date" in r)
    when = f"measured {dates[0][:10]} to {dates[-1][:10]}" if dates else "dates not recorded"
    versions = sorted({numerics_of(r) for r in runs})
    numerics = ", ".join(map(str, versions)) + (
        "" if NUMERICS_VERSION in versions else f", not the current code's {NUMERICS_VERSION}")
    return (f"Settings: `--scale {scale.name}`; {len(runs)} runs, {when}; device {seen('device')}; "
            f"CPU {seen('cpu')}; threads per run {seen('threads')}; torch {seen('torch')}; "
            f"commit {seen('commit')}; numerics version {numerics}. Every option of every run is "
            "in `results.json`; the verdicts in `findings.json`.")


def run_ablation(spec: Ablation, scale: Scale, store: ResultStore, args: argparse.Namespace,
                 minutes: float) -> str:
    """Measure the runs the ablation lacks (unless --report-only), then write its report."""
    out, rerun = args.out / spec.name, f"python -m benchmarks {spec.name} --scale {scale.name}"
    assignment = args.assignment if spec.parallel else args.assignment.alone()
    runs = [dataclasses.replace(run, threads=assignment.keyed_threads(spec.trains))
            for run in spec.runs(scale)]
    if args.report_only:  # what is there: at this machine's threads, else the committed runs'
        store.refresh()
        found = records([r if store.get(r.key) else dataclasses.replace(r, threads=None)
                         for r in runs], store)
    else:
        from benchmarks.training import measure

        found = execute(runs, spec.measure or measure, store, assignment, quiet=args.quiet,
                        options=args.slurm, wait=not args.no_wait,
                        minutes=lambda run: minutes)
    if not found:
        return f"(no results of {spec.name} at --scale {scale.name} in {out} yet)"
    made = spec.report(found, out) if spec.report is not None else report(spec, found, out)
    body, verdicts = made if isinstance(made, tuple) else (made, [])
    versions = sorted({numerics_of(r) for r in found})
    write_text(out / "findings.json", json.dumps({"rule": RULE, "scale": scale.name,
                                                  "numerics": versions, "findings": verdicts},
                                                 indent=1) + "\n")
    partial = (f"**Incomplete: {len(found)} of {len(runs)} runs measured** (the rest: `{rerun}`); "
               "cells without all their seeds are judged on those they have.\n\n"
               if len(found) < len(runs) else "")
    mixed = (f"**Mixed code versions: numerics versions {', '.join(map(str, versions))}. This "
             f"table compares numbers of different code; measure again: `{rerun}`.**\n\n"
             if len(versions) > 1 else "")
    write_text(out / "README.md", f"# {spec.title}\n\n{partial}{mixed}"
                                  f"{settings_line(scale, found)}\n\n{body}\n")
    return body


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """`python -m benchmarks`, or `vitzoo bench` (vitzoo/commands/bench.py) as `prog` says."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gpu-check"]:
        from benchmarks import gpu_check

        return gpu_check.main(argv[1:])
    args = parse(argv, prog)
    scale, start = args.scale_settings, time.perf_counter()
    if scale.name == "rehearsal":  # its data, written once (a dry run plans it: writes nothing)
        from benchmarks.rehearsal_data import image_folder

        image_folder(scale.train["data"], write=not args.dry_run)
        if "transfer" in args.names:
            from benchmarks.ablations.transfer import write_rehearsal_data

            write_rehearsal_data(scale, write=not args.dry_run)
    args.slurm = SlurmOptions(args.partition, args.account, args.time_limit_min,
                              args.cpus_per_task, args.mem_per_task_gb, args.signal_delay_s)
    specs = [ABLATIONS[name] for name in args.names if name in ABLATIONS]
    numerics = None if args.report_only else NUMERICS_VERSION  # --report-only: every version
    stores = {s.name: ResultStore(args.out / s.name, numerics=numerics) for s in specs}
    plans = {} if args.report_only else {s.name: planning.plan_ablation(
        s, scale, stores[s.name].keys(), args.assignment if s.parallel else args.assignment.alone(),
        args.gpu_tflops) for s in specs}
    if plans:
        print(planning.describe(list(plans.values()), scale, args.assignment, args.gpu_tflops),
              flush=True)
    if args.dry_run:
        return 0
    names = [n for n in args.names if n != "loader"] if args.report_only else args.names
    with contextlib.ExitStack() as serving:
        if scale.name == "rehearsal" and "transfer" in names and not args.report_only:
            # the transfer's stand-in weights, downloaded from a loopback Hub as tags are
            from benchmarks.ablations.transfer import rehearsal_tags
            from benchmarks.transfer_runs import serve_weights

            serving.enter_context(serve_weights(args.out / "hub", rehearsal_tags()))
        for i, name in enumerate(names, 1):
            left = sum(p.minutes for n in names[i - 1:] if (p := plans.get(n)))
            print(f"\n== [{i}/{len(names)}] {name}"
                  + (f", about {left:.0f} min left (estimated)" if name in plans else ""))
            if name in NOT_ABLATIONS:
                run_benchmark(name, args)
                continue
            minutes = plans[name].longest_run_min if plans else 0.0
            print(run_ablation(ABLATIONS[name], scale, stores[name], args, minutes))
            print(f"\nResults, figures and README in {args.out / name}", flush=True)
    print(f"\n== done in {(time.perf_counter() - start) / 60:.1f} min; results in {args.out}")
    return 0


def run_benchmark(name: str, args: argparse.Namespace) -> None:
    """The benchmarks that are not ablations: speed against timm and torchvision, the loader."""
    if name == "speed":
        from benchmarks import speed

        speed.main(quick=args.scale == "quick", out=args.out / "speed", device=args.device,
                   report_only=args.report_only)
    else:
        from benchmarks import loader

        loader.main(out=args.out / "loader", quick=args.scale == "quick")
    print((args.out / name / "README.md").read_text())


if __name__ == "__main__":
    sys.exit(main())
