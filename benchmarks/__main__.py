"""python -m benchmarks LIST [--scale quick|main|cpu|rehearsal|gpu|paper] [--device cpu|cuda] [--dry-run] ...

LIST: ablation names (see benchmarks/ablations/), `all` (every ablation), `speed`, or `loader` (images/s
of one loader worker per scale that reads image files, and the start-up that grows with a dataset:
benchmarks/loader.py, which the plan uses); or `gpu-check` alone (the first command on a GPU machine:
benchmarks/gpu_check.py). Scales are in
benchmarks/scales.py: `main` is the main job's (Table 8's headline in minutes), `cpu` trains every
ablation to where architecture matters on a 2-core CPU (hours), `paper` is the paper's (GPUs, days),
`gpu` the paper's cells sized for a day on one 8-GPU node, `rehearsal` the paper's code path with every
dimension shrunk (minutes, CPU or GPU), `quick` is for tests (`--quick` is short for it).

Where runs go (benchmarks/runner.py): on the CPU `--workers N` runs go at once, each of
`--processes-per-run` gloo processes (the rehearsal's default: 2); on `--device cuda` each run is a
data-parallel job over `--gpus-per-run` GPUs (default: every visible GPU), started by PyTorch's elastic
launcher, runs side by side on disjoint GPU sets; `--launcher slurm` submits each run as a SLURM job of
`--nodes` x `--gpus-per-node` through submitit (benchmarks/slurm.py; requeued on preemption, resumed),
from a login node without GPUs (planned at `--gpu-tflops` per GPU, as `--dry-run` plans), and waits
unless `--no-wait` (a later invocation collects); what a job asks for is in docs/gpus.md. `--dry-run`
prints the plan for that same assignment (runs, FLOPs, minutes, device-hours) and trains nothing.

Results go to benchmarks/results/<ablation>/ (the rehearsal's to runs/rehearsal/; `vitzoo bench`'s to runs/bench/
unless --committed): results.json (every
run, its settings and environment), findings.json (the verdicts), README.md (the table beside the
paper's numbers, each finding judged by one rule), PNG figures; each run's folder (checkpoints, final
weights, logs) under <ablation>/runs/, ignored by git. Runs whose results exist are skipped, so an
interrupted suite continues, and a run interrupted mid-way resumes from its checkpoint. A result of
another numerics version (benchmarks/suite.py's NUMERICS_VERSION: the version of training's numbers)
counts as not measured and is measured again; `--report-only` reports whatever is there, and every
README's settings line names the numerics versions of its runs, loudly when they mix.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

from benchmarks import plan as planning
from benchmarks.ablations import ABLATIONS
from benchmarks.figures import MATPLOTLIB_MISSING
from benchmarks.assignment import LAUNCHERS, assign, common_share
from benchmarks.runner import execute
from benchmarks.runner import records as measured
from benchmarks.scales import SCALES, get_scale
from benchmarks.slurm import MEM_BASE_GB, MEM_PER_LOADER_WORKER_GB, SlurmOptions, signal_delay_s
from benchmarks.spec import Ablation, Scale, report
from benchmarks.suite import NUMERICS_VERSION, RESULTS, ResultStore, numerics_of, with_threads
from benchmarks.verdict import RULE
from vitzoo.argvalues import ArgumentParser
from vitzoo.io import write_text

REHEARSAL_OUT = Path("runs") / "rehearsal"  # the rehearsal's results never mix with the committed ones
# `vitzoo bench` (a user's command, from any directory) writes here unless --out or --committed says otherwise:
# the checkout's committed results change only when asked
BENCH_OUT = Path("runs") / "bench"
PROG = "python -m benchmarks"
NOT_ABLATIONS = ("speed", "loader")  # benchmarks of LIST that are not ablations
# the flags only --launcher slurm reads (another launcher would ignore them: refused instead)
SLURM_FLAGS = ("nodes", "gpus_per_node", "partition", "account", "time_limit_min", "cpus_per_task",
               "mem_per_task_gb", "signal_delay_s", "no_wait")
SLURM_COMMANDS = ("sbatch", "srun", "sacct")  # what submitit calls to submit and follow the jobs


def build_parser(prog: str = PROG) -> ArgumentParser:
    """The command line of `python -m benchmarks`, or, with `prog` "vitzoo bench", of `vitzoo bench`, whose
    results go to runs/bench by default."""
    parser = ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="+", help="ablations to run: " + ", ".join(ABLATIONS) + ", all, speed, or loader")
    parser.add_argument("--scale", choices=tuple(SCALES), default="cpu",
                        help="how big the runs are (benchmarks/scales.py; default cpu)")
    parser.add_argument("--quick", action="store_true", help="the same as --scale quick (seconds per run; for tests)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds per cell instead of the scale's (a run's key does not change: more seeds add runs)")
    parser.add_argument("--data", default=None,
                        help="dataset for --scale paper or gpu: an ImageFolder directory (ImageNet's layout), its shards "
                        "(vitzoo shard: their folder or DIR/train-{000000..000127}.tar), cifar10, cifar100")
    parser.add_argument("--data-dir", default=None, help="where the named dataset's files are (default $VITZOO_CACHE/datasets)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda (each run its own GPUs), or auto")
    default_out = RESULTS.relative_to(RESULTS.parents[1]) if prog == PROG else BENCH_OUT
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results root (default {default_out}; the rehearsal's: {REHEARSAL_OUT})")
    parser.add_argument("--committed", action="store_true",
                        help=f"write into the checkout's committed results, {RESULTS.relative_to(RESULTS.parents[1])}/ "
                        f"(the default of {PROG}; `vitzoo bench` writes to {BENCH_OUT} unless asked)")
    parser.add_argument("--workers", type=int, default=1,
                        help="CPU: training runs measured at once, in separate processes sharing the CPU threads "
                             "(2 on a 2-core CPU: small models gain about 1.5x); timing ablations always use one")
    parser.add_argument("--processes-per-run", type=int, default=None,
                        help="CPU: data-parallel gloo processes of each run (default: the scale's; the rehearsal's 2)")
    parser.add_argument("--gpus-per-run", type=int, default=None,
                        help="CUDA: GPUs of each run, one process each (default every visible GPU); the GPUs are cut "
                             "into disjoint sets of this size, one run on each at once")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local",
                        help="local (this machine: a process pool, or PyTorch's elastic launcher for a run of several "
                             "processes), slurm (a SLURM job per run, through submitit)")
    slurm = parser.add_argument_group("SLURM (--launcher slurm)")
    slurm.add_argument("--nodes", type=int, default=None, help="nodes of each run's job (default 1)")
    slurm.add_argument("--gpus-per-node", type=int, default=None,
                       help="GPUs (= tasks) per node of each job (default 8; the plan assumes --gpu-tflops each)")
    slurm.add_argument("--partition", default=None, help="default: the cluster's default partition")
    slurm.add_argument("--account", default=None, help="the SLURM account to charge (default: yours)")
    slurm.add_argument("--time-limit-min", type=float, default=None,
                       help="each job's time limit (default: its planned time x 1.5, at least 10 minutes; at most the "
                            "partition's MaxTime; a run that reaches it is requeued and resumes)")
    slurm.add_argument("--cpus-per-task", type=int, default=None,
                       help="CPUs of each task, asked of sbatch and srun (default: the run's loader workers + 2); its "
                            "torch threads are these less its loader workers")
    slurm.add_argument("--mem-per-task-gb", type=float, default=None,
                       help=f"memory of each task (default {MEM_BASE_GB:g} GB + {MEM_PER_LOADER_WORKER_GB:g} GB per loader "
                            "worker); sbatch's --mem is this x the tasks of a node")
    slurm.add_argument("--signal-delay-s", type=int, default=None,
                       help="USR2 this long before the time limit, to checkpoint (default: the plan's longest evaluation "
                            "x 1.5, at least 120 s, + 60 s to write the checkpoint)")
    slurm.add_argument("--no-wait", action="store_true",
                       help="submit and return; the jobs store their results, and running the same command again "
                            "collects them (and submits the runs whose job ended without a result)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (runs, FLOPs, estimated minutes on the assignment); train nothing")
    parser.add_argument("--gpus", type=int, default=8, help="with --dry-run for GPUs that are not here: GPUs per node")
    parser.add_argument("--gpu-tflops", type=float, default=planning.STATED_GPU_TFLOPS,
                        help="with --dry-run for GPUs that are not here: training TFLOP/s per GPU")
    parser.add_argument("--report-only", action="store_true",
                        help="write the tables, figures and verdicts from the results measured so far; train nothing")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def parse(argv: list[str] | None, prog: str = PROG) -> argparse.Namespace:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.quick:
        args.scale = "quick"
    names = list(ABLATIONS) if "all" in args.names else args.names
    unknown = [n for n in names if n not in ABLATIONS and n not in NOT_ABLATIONS]
    if unknown:
        parser.error(f"unknown ablation {unknown[0]!r}; choose from {', '.join(ABLATIONS)}, all, speed, loader (gpu-check alone)")
    for flag in ("workers", "seeds", "processes_per_run", "gpus_per_run", "nodes", "gpus_per_node", "cpus_per_task", "gpus"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    for flag in ("time_limit_min", "mem_per_task_gb", "signal_delay_s", "gpu_tflops"):
        if getattr(args, flag) is not None and not 0 < getattr(args, flag) < float("inf"):
            parser.error(f"--{flag.replace('_', '-')} must be positive (a finite number), got {getattr(args, flag)}")
    ignored = ["--" + f.replace("_", "-") for f in SLURM_FLAGS if getattr(args, f) not in (None, False)]
    if ignored and args.launcher != "slurm":
        parser.error(f"{', '.join(ignored)}: read by --launcher slurm only; --launcher {args.launcher} would ignore "
                     "them: give --launcher slurm, or leave them out")
    if args.launcher == "slurm" and args.device == "auto":
        parser.error("--device auto under --launcher slurm would be decided on this login node, which cannot see the "
                     "compute nodes' GPUs; say --device cuda or --device cpu")
    if not args.dry_run and importlib.util.find_spec("matplotlib") is None:  # said before the training, not after
        parser.error(MATPLOTLIB_MISSING)
    if args.committed and args.out is not None:
        parser.error(f"--committed writes into {RESULTS}; --out {args.out} names another folder: give one of the two")
    if args.out is None:
        args.out = (REHEARSAL_OUT if args.scale == "rehearsal" and not args.committed
                    else RESULTS if args.committed or prog == PROG else BENCH_OUT)
    try:
        # a dry run of the paper's scales needs no data: ImageNet-1k's size is assumed (benchmarks/plan.py);
        # the rehearsal writes its own, beside its results
        data = args.data or ("imagenet" if args.dry_run and args.scale in ("paper", "gpu") else None)
        if args.scale == "rehearsal" and data is None:
            data = str((args.out / "data" / "imagenet").resolve())
        args.scale_settings = get_scale(args.scale, data, args.data_dir)
        if args.seeds:
            args.scale_settings = dataclasses.replace(args.scale_settings, seeds=args.seeds)
        args.assignment = assign(args.device, args.launcher, gpus_per_run=args.gpus_per_run, workers=args.workers,
                                 processes_per_run=args.processes_per_run or args.scale_settings.processes_per_run,
                                 stated_gpus=args.gpus, nodes=args.nodes or 1, gpus_per_node=args.gpus_per_node,
                                 share=batch_share_of(names, args.scale_settings))
    except ValueError as exc:
        parser.error(str(exc))
    if args.assignment.device == "cuda" and not args.assignment.present and not args.dry_run and args.launcher != "slurm":
        parser.error(f"--device {args.device}: no CUDA GPU is visible here (--dry-run plans for GPUs that are not here)")
    args.names = names
    return args


def batch_share_of(names: list[str], scale: Scale) -> int:
    """What the processes of every data-parallel run of these ablations must divide (`common_share`):
    each training of each run, its fine-tuning and sweeps included."""
    trainings = [train for name in names if name in ABLATIONS and ABLATIONS[name].parallel
                 for run in ABLATIONS[name].runs(scale) for train in (run.config["train"], *run.config.get("more_train", ()))]
    return common_share(trainings)


def numerics_versions(records: list[dict]) -> dict[int, int]:
    """Runs per numerics version of the code that measured them (0: before versions were recorded)."""
    counts: dict[int, int] = {}
    for r in records:
        counts[numerics_of(r)] = counts.get(numerics_of(r), 0) + 1
    return dict(sorted(counts.items()))


def numerics_named(version: int) -> str:
    return f"{version} (recorded before the version existed)" if version == 0 else str(version)


def mixed_versions(records: list[dict], rerun: str) -> str:
    """A loud paragraph when the table's runs come from code of several numerics versions, else ''."""
    versions = numerics_versions(records)
    if len(versions) < 2:
        return ""
    each = "; ".join(f"{n} runs of version {numerics_named(v)}" for v, n in versions.items())
    return (f"**Mixed code versions: {each}. Training's numbers differ between versions, so this table compares "
            f"numbers of different code; measure the rest again with the current code (numerics version "
            f"{NUMERICS_VERSION}): `{rerun}`.**\n\n")


def settings_line(scale: Scale, records: list[dict]) -> str:
    seen = lambda field: ", ".join(sorted({str(r.get(field, "?")) for r in records})) or "?"  # noqa: E731
    dates = sorted(r["date"] for r in records if "date" in r)
    when = f"measured {dates[0][:10]} to {dates[-1][:10]}" if dates else "dates not recorded"
    versions = ", ".join(numerics_named(v) for v in numerics_versions(records)) or "?"
    if NUMERICS_VERSION not in numerics_versions(records):
        versions += f", not the current code's {NUMERICS_VERSION}"
    return (f"Settings: `--scale {scale.name}`; {len(records)} runs, {when}; device {seen('device')}; "
            f"CPU {seen('cpu')}; threads per run {seen('threads')}; torch {seen('torch')}; commit {seen('commit')}; "
            f"numerics version {versions}. "
            f"Every option of every run is in `results.json`; the verdicts in `findings.json`.")


def run_ablation(spec: Ablation, scale: Scale, store: ResultStore, args: argparse.Namespace,
                 plan: planning.AblationPlan) -> str:
    out = args.out / spec.name
    measure = spec.measure
    if measure is None:
        from benchmarks.training import measure
    # the keys hold the threads each run trains with (benchmarks.suite.Run.key)
    runs = with_threads(spec.runs(scale), (args.assignment if spec.parallel else args.assignment.alone()).keyed_threads(spec.trains))
    if args.report_only:  # the runs measured so far, e.g. of a suite still running, of any numerics version
        # and of any thread count: a run's record at this machine's threads, else at the committed runs' (the
        # settings line names the thread counts of the runs reported)
        store.refresh()
        records = measured([run if store.get(run.key) else dataclasses.replace(run, threads=None) for run in runs], store)
    else:
        minutes = lambda run: plan.longest_run_min  # noqa: E731  (a job's time limit: the longest run's, with a margin)
        # the warning before a job's limit covers the plan's longest evaluation, unless --signal-delay-s says
        cluster = dataclasses.replace(args.slurm, signal_delay_s=args.slurm.signal_delay_s
                                      or signal_delay_s(plan.longest_eval_min))
        records = execute(runs, measure, store, args.assignment if spec.parallel else args.assignment.alone(),
                          quiet=args.quiet, slurm_options=cluster, wait_for_jobs=not args.no_wait, minutes=minutes)
    if not records:
        return f"(no results of {spec.name} at --scale {scale.name} in {out} yet)"
    if spec.report is not None:  # its own report: the body, or the body and the verdicts
        made = spec.report(records, out)
        body, verdicts = made if isinstance(made, tuple) else (made, [])
    else:
        body, verdicts = report(spec, records, out)
    write_text(out / "findings.json", json.dumps({"rule": RULE, "scale": scale.name, "numerics": list(numerics_versions(records)),
                                                  "findings": verdicts}, indent=1) + "\n")
    missing = len(runs) - len(records)
    partial = (f"**Incomplete: {len(records)} of {len(runs)} runs measured** (the rest resume with "
               f"`python -m benchmarks {spec.name} --scale {scale.name}`); cells without all their seeds are "
               "judged on those they have.\n\n") if missing else ""
    mixed = mixed_versions(records, f"python -m benchmarks {spec.name} --scale {scale.name}")
    write_text(out / "README.md", f"# {spec.title}\n\n{partial}{mixed}{settings_line(scale, records)}\n\n{body}\n")
    return body


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """The benchmarks, as `prog` (`python -m benchmarks`, or `vitzoo bench`: vitzoo/commands/bench.py) says."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gpu-check"]:
        from benchmarks import gpu_check

        return gpu_check.main(argv[1:])
    args = parse(argv, prog)
    missing = [name for name in SLURM_COMMANDS if shutil.which(name) is None]
    if args.launcher == "slurm" and missing and not (args.dry_run or args.report_only):
        # said before the plan and anything written
        print(f"{prog}: error: --launcher slurm needs SLURM's commands on PATH, and "
              f"{', '.join(missing)} are not found here: run from a SLURM login node, or plan with "
              "--dry-run", file=sys.stderr)
        return 2
    scale = args.scale_settings
    start = time.perf_counter()
    if scale.name == "rehearsal":  # its ImageNet, written once (the plan counts its images)
        from benchmarks.rehearsal_data import image_folder

        image_folder(scale.train["data"], write=not args.dry_run)  # a dry run writes nothing: planned only
        if "transfer" in args.names:  # and the transfer's stand-ins for its datasets
            from benchmarks.ablations.transfer import write_rehearsal_data

            write_rehearsal_data(scale, write=not args.dry_run)
    args.slurm = SlurmOptions(partition=args.partition, account=args.account, time_limit_min=args.time_limit_min,
                              cpus_per_task=args.cpus_per_task, mem_per_task_gb=args.mem_per_task_gb,
                              signal_delay_s=args.signal_delay_s)
    specs = [ABLATIONS[name] for name in args.names if name in ABLATIONS]
    # --report-only reports what is there, whatever its numerics version; a suite measures for the current one
    numerics = None if args.report_only else NUMERICS_VERSION
    stores = {spec.name: ResultStore(args.out / spec.name, numerics=numerics) for spec in specs}
    plans = {spec.name: planning.plan_ablation(spec, scale, stores[spec.name].keys(),
                                               (args.assignment if spec.parallel else args.assignment.alone()), args.gpu_tflops) for spec in specs}
    print(planning.describe(list(plans.values()), scale, args.assignment, args.gpu_tflops), flush=True)
    if args.dry_run:
        return 0
    problems = [p for p in plans.values() if p.problem and p.to_measure]
    if args.launcher == "slurm" and problems and not args.report_only:  # a job's time limit comes from the plan
        print(f"\nnothing submitted: the plan of {problems[0].name} found a problem: {problems[0].problem}",
              file=sys.stderr, flush=True)
        return 2
    if args.report_only:  # the speed benchmark reports its stored records; the loader has no report
        args.names = [n for n in args.names if n != "loader"]
    with contextlib.ExitStack() as serving:
        if scale.name == "rehearsal" and "transfer" in args.names and not args.report_only:
            # the transfer rehearsal's weights, downloaded from a Hub as the paper's tags are: a loopback one
            from benchmarks.ablations.transfer import rehearsal_tags
            from benchmarks.transfer_runs import serve_weights

            serving.enter_context(serve_weights(args.out / "hub", rehearsal_tags()))
        run_all(args, plans, stores, scale)
    print(f"\n== done in {(time.perf_counter() - start) / 60:.1f} min; results in {args.out}")
    return 0


def run_all(args: argparse.Namespace, plans: dict, stores: dict, scale: Scale) -> None:
    for i, name in enumerate(args.names, 1):
        left = sum(plans[n].minutes for n in args.names[i - 1:] if n in plans and not plans[n].problem)
        print(f"\n== [{i}/{len(args.names)}] {name}" + (f", about {left:.0f} min left (estimated)" if name in plans else ""),
              flush=True)
        if name == "speed":
            from benchmarks import speed

            speed.main(quick=args.scale == "quick", out=args.out / "speed", device=args.device,
                       report_only=args.report_only)
            print((args.out / "speed" / "README.md").read_text())
            continue
        if name == "loader":
            from benchmarks import loader

            loader.main(out=args.out / "loader", quick=args.scale == "quick")
            print((args.out / "loader" / "README.md").read_text())
            continue
        spec = ABLATIONS[name]
        print(run_ablation(spec, scale, stores[name], args, plans[name]), flush=True)
        print(f"\nResults, figures and README in {args.out / name}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
