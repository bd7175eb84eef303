"""The jobs submitted for an ablation's runs: where each is written down, what state it is in, and how
one that ended without a result ended.

A run's job is written down in its own file, JOB in the run's folder (runs/<key>-n<numerics>/, beside
its record), never in a file shared under a lock: a cluster's file system may have no lock that holds
across nodes. A job's state comes from sacct; where sacct says UNKNOWN (it does not know the job:
accounting lag, purged records, accounting off), from scontrol, which knows every pending and running
job. A state that does not say whether the job lives (UNSURE_STATES) holds the job's place for a
bounded time only (`unknown_live_s`), counted from when it was first seen and written in the job file,
across invocations; after that the job counts as lost: what is on disk decides (a stored result is a
success; otherwise the run is submitted again and resumes from its checkpoint).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.suite import NUMERICS_VERSION, record_folder
from vitzoo.envvars import env_seconds
from vitzoo.io import write_text

JOB = "job.json"  # a run's job, in its folder

# the states in which a job still holds its place: not submitted again (sacct's names)
LIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING",
               "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}
# states that do not say whether the job lives: UNKNOWN (neither sacct nor scontrol knows it), and
# PREEMPTED (a job requeued after preemption passes through it; one that stays in it was not requeued)
UNSURE_STATES = {"UNKNOWN", "PREEMPTED"}
UNKNOWN_LIVE_S = 10 * 60.0  # how long an unsure state counts as live (VITZOO_SLURM_UNKNOWN_S overrides)
POLL_S = 30.0  # how often a waiting suite asks for its jobs' states (VITZOO_SLURM_POLL_S overrides)


def unknown_live_s() -> float:
    return env_seconds("VITZOO_SLURM_UNKNOWN_S", UNKNOWN_LIVE_S)


def poll_s() -> float:
    return env_seconds("VITZOO_SLURM_POLL_S", POLL_S)


# ---------------------------------------------------------------------------- job files
def job_file(store_dir: Path, key: str) -> Path:
    return record_folder(store_dir, key, NUMERICS_VERSION) / JOB


def read_jobs(store_dir: Path) -> dict[str, dict]:
    """run key -> {"key", "job_id", "folder", "launcher", "submitted", ...}: the jobs of this code's runs."""
    jobs = {}
    for path in Path(store_dir).glob(f"runs/*-n{NUMERICS_VERSION}/{JOB}"):
        try:
            entry = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):  # being replaced: atomic writes leave no half file
            continue
        jobs[entry["key"]] = entry
    return jobs


def write_job(store_dir: Path, entry: dict) -> None:
    write_text(job_file(store_dir, entry["key"]), json.dumps(entry, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------- states
def sacct_states(job_ids: list[str]) -> dict[str, str]:
    """job id -> sacct's state (its first word: "CANCELLED by 0" is CANCELLED); a job sacct does not list
    is left out (so is every job when sacct fails)."""
    try:
        out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobID,State", "-j", ",".join(job_ids)],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return {}
    states = {}
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        job_id, _, state = line.partition("|")
        if job_id in job_ids and state.strip():
            states[job_id] = state.split()[0]
    return states


def scontrol_state(job_id: str) -> str:
    """The job's state as the controller holds it (pending, running, and ended within MinJobAge), or UNKNOWN."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return "UNKNOWN"
    found = re.search(r"\bJobState=(\S+)", out.stdout) if out.returncode == 0 else None
    return found.group(1) if found else "UNKNOWN"


def local_state(entry: dict, job: Any = None) -> str:
    """A submitit-local job's state: RUNNING while its controller process lives, else FINISHED."""
    if job is not None:  # a child of this process: its Popen knows (and reaps it)
        return "RUNNING" if job.state == "RUNNING" else "FINISHED"
    try:
        os.kill(int(entry["job_id"]), 0)
    except (OSError, ValueError):
        return "FINISHED"
    return "RUNNING"


def job_states(entries: list[dict], local_jobs: dict[str, Any] | None = None) -> dict[str, str]:
    """job id -> state now, for every entry: one sacct call for the SLURM jobs, scontrol for those sacct
    does not know; `local_jobs`: the submitit-local jobs this process started, by id."""
    slurm_ids = [e["job_id"] for e in entries if e["launcher"] == "slurm"]
    states = sacct_states(slurm_ids) if slurm_ids else {}
    for job_id in slurm_ids:
        if states.get(job_id, "UNKNOWN") == "UNKNOWN":
            states[job_id] = scontrol_state(job_id)
    for entry in entries:
        if entry["launcher"] != "slurm":
            states[entry["job_id"]] = local_state(entry, (local_jobs or {}).get(entry["job_id"]))
    return states


def holds_place(entry: dict, state: str, store_dir: Path, bound_s: float, now: float | None = None) -> bool:
    """Whether the job still holds its run's place (is not to be submitted again). An unsure state holds
    it for `bound_s` seconds from when it was first seen, written in the job file."""
    now = time.time() if now is None else now
    if state in LIVE_STATES:
        if "unsure_since" in entry:  # known again
            del entry["unsure_since"]
            write_job(store_dir, entry)
        return True
    if state not in UNSURE_STATES:
        return False
    if "unsure_since" not in entry:
        entry["unsure_since"] = now
        write_job(store_dir, entry)
    return now - entry["unsure_since"] < bound_s


# ---------------------------------------------------------------------------- how a job ended
def task_errors(entry: dict) -> list[tuple[float, int, str]]:
    """(when, task, traceback) of every task of the job that raised: submitit's error record of each."""
    from submitit.core.utils import pickle_load

    errors = []
    for path in Path(entry["folder"]).glob(f"{entry['job_id']}_*_result.pkl"):
        try:
            outcome, value = pickle_load(path)
            task = int(path.name.split("_")[-2])
        except Exception:  # noqa: BLE001  (a record being written, or not one of a task)
            continue
        if outcome == "error":
            errors.append((path.stat().st_mtime, task, str(value)))
    return sorted(errors)


def job_failure(entry: dict) -> str | None:
    """What a job that ended without a result says of its end: the traceback of the task that failed
    first (the others often fail because it did), where its logs are; None when it left nothing."""
    folder, job_id = Path(entry["folder"]), entry["job_id"]
    errors = task_errors(entry)
    if errors:
        _, task, trace = errors[0]
        others = f"; task(s) {', '.join(str(t) for _, t, _ in errors[1:])} failed after it" if errors[1:] else ""
        return (f"task {task} (rank {task}) failed first{others}:\n{trace.strip()[-2500:]}\n"
                f"(logs: {folder / f'{job_id}_{task}_log.err'} and the other tasks' beside it)")
    logs = sorted(folder.glob(f"{job_id}_*_log.err")) + sorted(folder.glob(f"{job_id}_*_log.out"))
    for log in logs:
        text = log.read_text(errors="replace")
        if "Traceback" in text:
            return text[text.rindex("Traceback"):][-2500:] + f"\n(log: {log})"
    return f"no result and no traceback; logs: {', '.join(map(str, logs))}" if logs else None


__all__ = ["JOB", "LIVE_STATES", "POLL_S", "UNKNOWN_LIVE_S", "UNSURE_STATES", "holds_place", "job_failure",
           "job_file", "job_states", "poll_s", "read_jobs", "unknown_live_s", "write_job"]
