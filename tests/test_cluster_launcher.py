"""Runs as SLURM jobs, on this machine: submitit's local executor takes the code path of
`--launcher slurm` (one job per run, two gloo tasks each, rank 0 storing the result under the store's
lock), a preempted job is requeued and resumes from its checkpoint, and a suite that returned at once
(`--no-wait`) is collected by the next invocation without submitting anything twice."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("submitit", reason="the cluster launcher's tests need submitit (pip install -e '.[test]')")

from benchmarks.ablations import ABLATIONS  # noqa: E402
from benchmarks.execute import execute  # noqa: E402
from benchmarks.launchers import slurm  # noqa: E402
from benchmarks.launchers.assign import assign  # noqa: E402
from benchmarks.rehearsal_data import image_folder  # noqa: E402
from benchmarks.scales import get_scale  # noqa: E402
from benchmarks.suite import ResultStore, Run, run_folder  # noqa: E402
from benchmarks.training import measure  # noqa: E402

CHECKOUT = Path(__file__).resolve().parents[1]


def benchmarks(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=CHECKOUT, env=env)


@pytest.mark.slow
def test_a_suite_that_did_not_wait_is_collected_by_the_next_invocation(tmp_path):
    submitted = benchmarks("head", "--scale", "rehearsal", "--launcher", "submitit-local", "--no-wait", "--out",
                           str(tmp_path))
    assert submitted.returncode == 0, submitted.stdout[-2000:] + submitted.stderr[-2000:]
    assert submitted.stdout.count("submitted ") == 8  # every run of the head ablation, two seeds of four cells
    jobs = json.loads((tmp_path / "head" / "jobs.json").read_text())["jobs"]
    collected = benchmarks("head", "--scale", "rehearsal", "--launcher", "submitit-local", "--out", str(tmp_path))
    assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    assert "submitted " not in collected.stdout  # live or finished jobs are not submitted again
    assert json.loads((tmp_path / "head" / "jobs.json").read_text())["jobs"] == jobs
    records = json.loads((tmp_path / "head" / "results.json").read_text())["runs"]
    assert len(records) == 8 and {r["launcher"] for r in records} == {"submitit-local"}
    assert {r["processes"] for r in records} == {2} and {r["world_size"] for r in records} == {2}
    assert {r["job_id"] for r in records} == {entry["job_id"] for entry in jobs.values()}
    findings = json.loads((tmp_path / "head" / "findings.json").read_text())["findings"]
    judged = {"reproduced", "not reproduced", "inconclusive"}  # two seeds: judged by the rule, none "not testable"
    assert {f["verdict"] for f in findings} <= judged


def _tasks_of(controller: int) -> list[int]:
    """The processes a local job's controller started (its tasks)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == controller:
            children.append(int(stat.parent.name))
    return children


def _long_run(data: Path) -> Run:
    """A rehearsal run of the head ablation trained for 300 steps: long enough to be preempted mid-way."""
    run = ABLATIONS["head"].runs(get_scale("rehearsal", str(data)))[0]
    train = {**run.config["train"], "epochs": 15.0, "eval_every": 0}
    return Run(run.ablation, run.label, {**run.config, "train": train}, run.seed, run.group)


@pytest.mark.slow
def test_a_preempted_job_is_requeued_and_resumes_where_it_stopped(tmp_path):
    run = _long_run(image_folder(tmp_path / "imagenet"))
    # the same run, uninterrupted, through the local launcher: the reference
    reference = execute([run], measure, ResultStore(tmp_path / "local"), assign("cpu", processes_per_run=2), quiet=True)[0]
    store = ResultStore(tmp_path / "cluster")
    slurm.submit([run], measure, store, assign("cpu", "submitit-local", processes_per_run=2), slurm.SlurmOptions(),
                 wait=False, minutes=lambda r: 10.0, quiet=True)
    entry = slurm.read_jobs(store.directory)[run.key]
    metrics = run_folder(store, run) / "train" / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):  # training is under way
        assert time.time() < deadline, "the job did not start training"
        time.sleep(0.2)
    tasks = _tasks_of(int(entry["job_id"]))
    assert len(tasks) == 2
    for pid in tasks:  # what the controller (and SLURM) sends before a time limit or a preemption
        os.kill(pid, signal.SIGUSR2)
    deadline = time.time() + 240
    while store.get(run.key) is None:
        assert time.time() < deadline, f"no result after the requeue: {slurm.job_failure(entry)}"
        time.sleep(1)
        store.refresh()
    logs = "".join(p.read_text(errors="replace") for p in Path(entry["folder"]).glob(f"{entry['job_id']}_*"))
    assert "Requeued job" in logs  # submitit requeued it ...
    assert "resuming run" in logs  # ... and the new attempt went on from the checkpoint the stop wrote
    record = store.get(run.key)
    summary = json.loads((run_folder(store, run) / "train" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 300
    # resumed exactly: the same final loss and test accuracy as the run that was never stopped
    assert record["metrics"]["final_loss"] == pytest.approx(reference["metrics"]["final_loss"], abs=1e-6)
    assert record["metrics"]["test_acc"] == reference["metrics"]["test_acc"]
