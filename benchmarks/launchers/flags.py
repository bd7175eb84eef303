"""Which launcher reads which of the suite's cluster flags, so that a flag the chosen launcher would
ignore is refused instead (`--launcher local --nodes 2` had planned and trained on one machine without
a word), and `--launcher slurm` is refused on a machine without SLURM's commands before any plan or
submission (submitit's "Could not detect srun" came as a traceback after the plan)."""

from __future__ import annotations

import argparse
import shutil

# flag (its argparse dest) -> the launchers that read it
READ_BY = {
    "nodes": ("slurm",),
    "gpus_per_node": ("slurm",),
    "partition": ("slurm",),
    "account": ("slurm",),
    "time_limit_min": ("slurm", "submitit-local"),
    "cpus_per_task": ("slurm", "submitit-local"),
    "mem_per_task_gb": ("slurm", "submitit-local"),
    "signal_delay_s": ("slurm", "submitit-local"),
    "no_wait": ("slurm", "submitit-local"),
}
# what `--launcher slurm` calls to submit and follow its jobs (submitit needs srun; sbatch and sacct are ours)
SLURM_COMMANDS = ("sbatch", "srun", "sacct")


def flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def ignored_flags(args: argparse.Namespace) -> list[str]:
    """The cluster flags given (not None, not False) that `args.launcher` would not read."""
    return [flag(dest) for dest, launchers in READ_BY.items()
            if getattr(args, dest, None) not in (None, False) and args.launcher not in launchers]


def refusal(args: argparse.Namespace) -> str | None:
    """Why these options cannot run as given (a flag the launcher would ignore), or None."""
    ignored = ignored_flags(args)
    if not ignored:
        return None
    readers = sorted({launcher for dest, launchers in READ_BY.items() if flag(dest) in ignored for launcher in launchers})
    one = len(ignored) == 1
    return (f"{', '.join(ignored)} {'is' if one else 'are'} not read by --launcher {args.launcher}, which would ignore "
            f"{'it' if one else 'them'}: give --launcher {' or '.join(readers)}, or leave {'it' if one else 'them'} out")


def slurm_missing(args: argparse.Namespace) -> str | None:
    """Why `--launcher slurm` cannot submit from this machine (SLURM's commands are not on PATH), or
    None. Asked only of a suite that will submit: a dry run or --report-only needs no cluster."""
    missing = [name for name in SLURM_COMMANDS if shutil.which(name) is None]
    if args.launcher != "slurm" or args.dry_run or args.report_only or not missing:
        return None
    return (f"--launcher slurm needs SLURM's commands on PATH, and {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            "not found on this machine: run from a SLURM login node, plan with --dry-run, or rehearse SLURM's code path "
            "here with --launcher submitit-local")


__all__ = ["READ_BY", "SLURM_COMMANDS", "ignored_flags", "refusal", "slurm_missing"]
