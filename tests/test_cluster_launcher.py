"""The benchmarks' SLURM path without a cluster: submitit's real SlurmExecutor submits to the
stand-in SLURM commands of tests/slurm_standin/ (first on PATH), which run each job here as
processes with SLURM's environment and record every sbatch script and srun command line."""

import importlib.util
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

submitit = pytest.importorskip("submitit", reason="needs submitit (pip install -e '.[test]')")

import cloudpickle  # noqa: E402

from benchmarks import slurm  # noqa: E402
from benchmarks.__main__ import main  # noqa: E402
from benchmarks.ablations import ABLATIONS  # noqa: E402
from benchmarks.runner import assign  # noqa: E402
from benchmarks.rehearsal_data import image_folder  # noqa: E402
from benchmarks.scales import get_scale  # noqa: E402
from benchmarks.slurm import SlurmOptions, job_parameters  # noqa: E402
from benchmarks.suite import ResultStore, Run, run_folder  # noqa: E402
from benchmarks.training import measure  # noqa: E402

CHECKOUT = Path(__file__).resolve().parents[1]
STANDIN = CHECKOUT / "tests" / "slurm_standin"
_spec = importlib.util.spec_from_file_location("slurm_standin_cluster", STANDIN / "_cluster.py")
standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin)
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # jobs run this module's functions
# what a login shell may carry (a torchrun session, a GPU picked by hand): none may reach a job
LOGIN_SHELL = {"RANK": "5", "WORLD_SIZE": "7", "LOCAL_RANK": "3", "MASTER_ADDR": "login.invalid",
               "MASTER_PORT": "29511", "CUDA_VISIBLE_DEVICES": "9",
               "TORCHELASTIC_USE_AGENT_STORE": "True"}
GPU_JOBS = ["head", "--scale", "gpu", "--device", "cuda", "--launcher", "slurm", "--seeds", "1",
            "--no-wait"]


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    state = tmp_path / "standin"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_STANDIN_STATE", str(state))
    monkeypatch.setenv("PYTHONPATH", f"{CHECKOUT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setattr(slurm, "POLL_S", 0.3)
    # job ids start again at 1000 on each stand-in cluster: submitit's memory of states too
    monkeypatch.setattr(submitit.SlurmJob, "watcher", submitit.slurm.slurm.SlurmInfoWatcher())
    yield state
    standin.shutdown(state)  # a job a failing test left running


def asked(state: Path, command: str) -> list[dict]:
    path = state / f"{command}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def job_of(store: ResultStore, run: Run) -> str:
    return json.loads((run_folder(store, run) / slurm.JOB).read_text())["job_id"]


def in_thread(target, *args, **kwargs) -> tuple[threading.Thread, dict]:
    """The suite's wait in a thread, so that a test can bound it."""
    outcome = {"started": time.time()}

    def run():
        try:
            target(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (the test reads it)
            outcome["error"] = exc
        outcome["seconds"] = time.time() - outcome["started"]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_login_node_without_gpus_submits_gpu_jobs_asking_for_what_they_need(
        cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_STANDIN_HOLD", "1")  # recorded, never run
    command = [*GPU_JOBS, "--data", str(tmp_path / "imagenet"), "--partition", "gpu",
               "--out", str(tmp_path / "out")]
    assert main(command) == 0
    assert "Plan at `--scale gpu`" in capsys.readouterr().out
    scripts = [entry["script"] for entry in asked(cluster, "sbatch")]
    assert len(scripts) == 4  # head: four cells, one seed each
    workers = get_scale("gpu", "imagenet").train["num_workers"]
    cpus, mem = workers + 2, 8 * (8 + 2 * workers)  # per task; a node's 8 tasks' memory
    for script in scripts:
        for line in ("--gpus-per-node=8", "--ntasks-per-node=8", "--nodes=1", "--requeue",
                     f"--cpus-per-task={cpus}", f"--mem={mem}GB", "--signal=USR2@180",
                     "--partition=gpu"):
            assert f"#SBATCH {line}\n" in script, line
        srun = next(line for line in script.splitlines() if line.startswith("srun "))
        assert f"--cpus-per-task={cpus}" in srun and "--kill-on-bad-exit=1" in srun
    assert len(list((tmp_path / "out" / "head" / "runs").glob(f"*/{slurm.JOB}"))) == 4
    assert main(command) == 0  # again: the pending jobs hold their runs' places
    assert "submitted " not in capsys.readouterr().out and len(asked(cluster, "sbatch")) == 4


def test_a_jobs_time_limit_is_the_plans_with_a_margin_and_must_leave_time_to_train():
    run = ABLATIONS["head"].runs(get_scale("gpu", "imagenet"))[0]
    cuda = assign("cuda", "slurm", gpus=8)
    made = job_parameters(cuda, SlurmOptions(), run, minutes=40.0)
    assert (made["time"], made["signal_delay_s"], made["mem"], made["cpus_per_task"]) == \
        (60, 180, "192GB", 10)
    own = job_parameters(cuda, SlurmOptions(cpus_per_task=4, mem_per_task_gb=6.5,
                                            time_limit_min=30), run, minutes=math.nan)
    assert (own["cpus_per_task"], own["mem"], own["time"]) == (4, "52GB", 30)
    with pytest.raises(ValueError, match="--time-limit-min"):  # no time left to train
        job_parameters(cuda, SlurmOptions(time_limit_min=10, signal_delay_s=400), run, 1.0)


def _short_run(tmp_path: Path) -> Run:
    """A rehearsal run of 2 processes, 40 steps, a metrics line every 2, no evaluation meanwhile."""
    run = ABLATIONS["head"].runs(get_scale("rehearsal", str(image_folder(tmp_path / "data"))))[0]
    train = {**run.config["train"], "val_size": 0, "eval_every": 0, "keep_best": False,
             "log_every": 2}
    return Run(run.ablation, run.label, {**run.config, "train": train}, run.seed, run.group)


@pytest.mark.slow
def test_cpu_jobs_train_to_the_end_and_a_preempted_one_resumes_to_the_same_loss(
        cluster, tmp_path, monkeypatch):
    for name, value in LOGIN_SHELL.items():  # sbatch exports the submitting shell's environment
        monkeypatch.setenv(name, value)
    run, cpu = _short_run(tmp_path), assign("cpu", "slurm", processes_per_run=2)
    options = SlurmOptions(cpus_per_task=2)  # one loader worker: one torch thread each
    whole, preempted = ResultStore(tmp_path / "whole"), ResultStore(tmp_path / "preempted")
    for store in (whole, preempted):  # at once, sharing the node, each on its own port
        slurm.submit([run], measure, store, cpu, options, wait=False, quiet=True)
    whole_job, job = job_of(whole, run), job_of(preempted, run)
    metrics, deadline = run_folder(preempted, run) / "train" / "metrics.jsonl", time.time() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert time.time() < deadline and (cluster / "jobs" / job / "state").read_text() in (
            "PENDING", "RUNNING"), "the job did not start training"
        time.sleep(0.1)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)  # SLURM's warning
    for store in (whole, preempted):  # the suite's wait collects both
        thread, outcome = in_thread(slurm.submit, [run], measure, store, cpu, options, quiet=True)
        thread.join(300)
        assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    assert [(cluster / "jobs" / j / "restarts").read_text() for j in (whole_job, job)] == ["0", "1"]
    assert [r["restart"] for r in asked(cluster, "srun") if r["job_id"] == job] == [0, 1]
    for job_id, name in ((whole_job, "whole"), (job, "preempted")):
        logs = "".join(p.read_text()
                       for p in (tmp_path / name / "jobs").glob(f"{job_id}_*_log.err"))
        assert ("resuming run" in logs) == (name == "preempted")
        rendezvous = 20000 + int(job_id) % 40000  # the job's own, none of the login shell's
        assert f"rank 1 of 2, rendezvous 127.0.0.1:{rendezvous}, 1 thread(s)" in logs
        assert "CUDA_VISIBLE_DEVICES=9" not in logs
    record, again = whole.get(run.key), preempted.get(run.key)
    assert (record["launcher"], record["world_size"], record["job_id"]) == ("slurm", 2, whole_job)
    summary = json.loads((run_folder(preempted, run) / "train" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 40
    # resumed exactly: the loss and accuracy of the job never stopped
    assert again["metrics"]["final_loss"] == pytest.approx(record["metrics"]["final_loss"],
                                                          abs=1e-6)
    assert again["metrics"]["test_acc"] == record["metrics"]["test_acc"]


def fail_on_rank_1(run, device, out):
    """Rank 1 fails once the group exists; rank 0 waits for ever, as in an NCCL collective."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.distributed_c10d._get_default_store().wait(["never set"], datetime.timedelta(seconds=600))


@pytest.mark.slow
def test_a_failing_rank_ends_its_job_and_the_suite_says_why(cluster, tmp_path):
    run, store = Run("head", "failing", {"train": {}}, 0), ResultStore(tmp_path / "results")
    thread, outcome = in_thread(slurm.submit, [run], fail_on_rank_1, store,
                                assign("cpu", "slurm", processes_per_run=2), quiet=True)
    thread.join(400)  # rank 0 alone would wait 600 s
    assert not thread.is_alive(), "the suite still waits for a job whose rank 1 failed"
    said = str(outcome["error"])
    assert outcome["seconds"] < 300 and "ended (FAILED) without storing a result" in said
    assert "task 1 (rank 1) failed first" in said and "rank 1 fails on purpose" in said
    assert (cluster / "jobs" / job_of(store, run) / "state").read_text() == "FAILED"
