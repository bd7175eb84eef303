"""The benchmarks' SLURM path, rehearsed without a cluster: submitit's real SlurmExecutor submits to the
stand-in SLURM commands of tests/slurm_standin/ (first on PATH), which run each job here as processes
with SLURM's environment and record every sbatch script and srun command line.

From a login node without a GPU, `--device cuda --launcher slurm` submits GPU jobs asking for what the
run needs (CPUs, memory, --requeue; srun's CPUs and --kill-on-bad-exit) within the partition's time
limit; a CPU job trains to its end and stores its result, a preempted one is requeued and resumes to
the same final loss, whatever the submitting shell's environment carried; a failing rank ends its job
and the suite says why; a job SLURM no longer knows is not waited for for ever."""

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

pytest.importorskip("submitit", reason="the cluster launcher's tests need submitit (pip install -e '.[test]')")

import cloudpickle  # noqa: E402
import submitit  # noqa: E402

from benchmarks import plan as planning  # noqa: E402
from benchmarks.__main__ import main, parse  # noqa: E402
from benchmarks.ablations import ABLATIONS  # noqa: E402
from benchmarks import slurm  # noqa: E402
from benchmarks.assignment import assign  # noqa: E402
from benchmarks.slurm import SlurmOptions, job_request, signal_delay_s, slurm_minutes  # noqa: E402
from benchmarks.rehearsal_data import image_folder  # noqa: E402
from benchmarks.scales import get_scale  # noqa: E402
from benchmarks.suite import ResultStore, Run, run_folder  # noqa: E402
from benchmarks.training import measure  # noqa: E402

CHECKOUT = Path(__file__).resolve().parents[1]
STANDIN = CHECKOUT / "tests" / "slurm_standin"
_spec = importlib.util.spec_from_file_location("slurm_standin_cluster", STANDIN / "_cluster.py")
standin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(standin)
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the jobs run this module's measure functions
# what a login shell may carry (a torchrun session, a GPU picked by hand): none of it may reach a job's ranks
LOGIN_SHELL = {"RANK": "5", "WORLD_SIZE": "7", "LOCAL_RANK": "3", "MASTER_ADDR": "login.invalid", "MASTER_PORT": "29511",
               "CUDA_VISIBLE_DEVICES": "9"}


class Cluster:
    """The stand-in cluster of one test: what it was asked, and its jobs' states."""

    def __init__(self, state: Path) -> None:
        self.state = state

    def asked(self, command: str) -> list[dict]:
        path = self.state / f"{command}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def job(self, job_id: str, name: str = "state") -> str:
        return (self.state / "jobs" / job_id / name).read_text().strip()


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    state = tmp_path / "standin"
    state.mkdir()
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_STANDIN_STATE", str(state))
    monkeypatch.setenv("PYTHONPATH", f"{CHECKOUT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    # job ids start again at 1000 on each stand-in cluster: submitit's memory of states starts afresh
    monkeypatch.setattr(submitit.SlurmJob, "watcher", submitit.slurm.slurm.SlurmInfoWatcher())
    yield Cluster(state)
    standin.shutdown(state)  # a job a failing test left running


def job_of(store: ResultStore, run: Run) -> str:
    return json.loads((run_folder(store, run) / slurm.JOB).read_text())["job_id"]


def waiting(target, *args, **kwargs) -> tuple[threading.Thread, dict]:
    """Run the suite's wait in a thread, so that a test can bound it (a wait for ever fails the test)."""
    outcome = {}

    def run():
        started = time.time()
        try:
            target(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001  (the test reads it)
            outcome["error"] = exc
        outcome["seconds"] = time.time() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


# ---------------------------------------------------------------------------- submitting from a login node
def test_a_login_node_without_gpus_submits_gpu_jobs_asking_for_what_they_need(cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SLURM_STANDIN_HOLD", "1")  # recorded, never run
    monkeypatch.setenv("SLURM_STANDIN_MAXTIME", "00:12:00")
    command = ["head", "--scale", "gpu", "--data", str(tmp_path / "imagenet"), "--device", "cuda", "--launcher", "slurm",
               "--gpus-per-node", "8", "--seeds", "1", "--partition", "gpu", "--no-wait", "--out", str(tmp_path / "out")]
    assert main(command) == 0
    said = capsys.readouterr().out
    assert "Plan at `--scale gpu`" in said and said.count("submitted ") == 4  # head: four cells, one seed each
    assert "clamped from" in said and "MaxTime" in said  # the plan's limit is above the partition's: said so
    scripts = [entry["script"] for entry in cluster.asked("sbatch")]
    assert len(scripts) == 4
    train = get_scale("gpu", "imagenet").train
    cpus, mem = train["num_workers"] + 2, 8 * (8 + 2 * train["num_workers"])  # per task, x 8 tasks of the node
    for script in scripts:
        for line in ("--gpus-per-node=8", "--ntasks-per-node=8", "--nodes=1", f"--cpus-per-task={cpus}", f"--mem={mem}GB",
                     "--requeue", "--time=12", "--signal=USR2@180", "--partition=gpu"):
            assert f"#SBATCH {line}\n" in script, line
        srun = next(line for line in script.splitlines() if line.startswith("srun "))
        assert f"--cpus-per-task={cpus}" in srun and "--kill-on-bad-exit=1" in srun
    assert len(list((tmp_path / "out" / "head" / "runs").glob(f"*/{slurm.JOB}"))) == 4
    assert main(command) == 0  # again: the pending jobs hold their runs' places
    assert "submitted " not in capsys.readouterr().out and len(cluster.asked("sbatch")) == 4


def test_a_plan_with_a_problem_submits_nothing_and_names_it(cluster, tmp_path, monkeypatch, capsys):
    def unplannable(spec, scale, done, assignment, gpu_tflops=None, recorded=None):
        return planning.AblationPlan(spec.name, 4, 4, 1e18, float("nan"), None,
                                     problem="vit_l16 at micro-batch 64 in bfloat16 does not fit on the GPU")

    monkeypatch.setattr(planning, "plan_ablation", unplannable)
    assert main(["head", "--scale", "gpu", "--data", str(tmp_path), "--device", "cuda", "--launcher", "slurm",
                 "--seeds", "1", "--no-wait", "--out", str(tmp_path / "out")]) == 2
    assert "nothing submitted" in capsys.readouterr().err
    assert cluster.asked("sbatch") == []


@pytest.mark.parametrize("flags, says", [
    (["--device", "auto"], "say --device cuda or --device cpu"),
    (["--time-limit-min", "0"], "--time-limit-min must be positive"),
    (["--time-limit-min", "-5"], "--time-limit-min must be positive"),
    (["--cpus-per-task", "0"], "--cpus-per-task must be at least 1"),
    (["--mem-per-task-gb", "0"], "--mem-per-task-gb must be positive"),
    (["--signal-delay-s", "-1"], "--signal-delay-s must be positive"),
])
def test_slurm_flags_that_cannot_work_are_refused_when_parsed(flags, says, capsys):
    with pytest.raises(SystemExit):
        parse(["head", "--scale", "gpu", "--data", "/data/imagenet", "--device", "cuda", "--launcher", "slurm", *flags])
    assert says in capsys.readouterr().err


def test_a_slurm_plan_is_for_the_compute_nodes_gpus_not_the_login_nodes():
    args = parse(["head", "--scale", "gpu", "--data", "/data/imagenet", "--device", "cuda", "--launcher", "slurm"])
    assert args.assignment.processes_per_run == 8 and not args.assignment.present  # --gpus-per-node's default
    assert parse(["head", "--scale", "gpu", "--data", "/d", "--device", "cuda", "--launcher", "slurm", "--nodes", "2",
                  "--gpus-per-node", "4"]).assignment.processes_per_run == 8


def test_a_jobs_request_its_time_limit_and_its_warning():
    run = ABLATIONS["head"].runs(get_scale("gpu", "imagenet"))[0]
    cuda = assign("cuda", "slurm", gpus_per_node=8)
    asked = job_request(cuda, SlurmOptions(), run, minutes=40.0)
    assert (asked.tasks_per_node, asked.gpus_per_node, asked.cpus_per_task, asked.mem_per_task_gb) == (8, 8, 10, 24.0)
    assert asked.time_limit_min == 60 and asked.signal_delay_s == 180 and asked.mem_gb_per_node == 192
    clamped = job_request(cuda, SlurmOptions(partition="gpu"), run, minutes=40.0, partition_max=45.0)
    assert clamped.time_limit_min == 45 and "clamped from 60 min" in clamped.note
    own = job_request(cuda, SlurmOptions(cpus_per_task=4, mem_per_task_gb=6.5, time_limit_min=30), run, minutes=math.nan)
    assert (own.cpus_per_task, own.mem_gb_per_node, own.time_limit_min) == (4, 52, 30)
    with pytest.raises(ValueError, match="found a problem"):  # no minutes from the plan: no 10-minute guess
        job_request(cuda, SlurmOptions(), run, minutes=math.nan)
    with pytest.raises(ValueError, match="--signal-delay-s"):  # the warning would leave no time to train
        job_request(cuda, SlurmOptions(time_limit_min=10, signal_delay_s=400), run, minutes=1.0)
    assert [slurm_minutes(t) for t in ("infinite", "1-00:00:00", "02:30:00", "45:30", "90", "UNLIMITED")] == \
        [None, 1440, 150, 45.5, 90, None]


def test_the_warning_before_the_limit_covers_the_plans_longest_evaluation():
    scale = get_scale("gpu", "imagenet")
    spec = ABLATIONS["head"]
    made = planning.plan_ablation(spec, scale, set(), assign("cuda", "slurm", gpus_per_node=8))
    run = spec.runs(scale)[0]
    # the test set of ImageNet, 50,000 images, forward only, on 8 GPUs at the stated 125 TFLOP/s, or at the
    # loaders' rate where they are slower
    on_gpus = 50_000 * planning.FORWARD_SHARE * planning.image_flops(planning._model_key(run)) / (8 * 125e12) / 60
    longest = max(planning.run_time(r, assign("cuda", "slurm", gpus_per_node=8), planning.STATED_GPU_TFLOPS).longest_eval_s
                  for r in spec.runs(scale))
    assert made.longest_eval_min == pytest.approx(longest / 60, rel=1e-9) and made.longest_eval_min >= on_gpus * (1 - 1e-9)
    assert signal_delay_s(0.0) == 180 and signal_delay_s(10.0) == 10 * 60 * 1.5 + 60  # at least 120 s, + a checkpoint


# ---------------------------------------------------------------------------- inside a job
def test_a_jobs_ranks_never_take_the_submitting_shells_rendezvous_or_gpus(monkeypatch):
    for name, value in {**LOGIN_SHELL, "TORCHELASTIC_USE_AGENT_STORE": "True", "SUBMITIT_EXECUTOR": "slurm",
                        "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
                        "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "node1"}.items():
        monkeypatch.setenv(name, value)
    slurm.export_rendezvous()
    assert {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")} == \
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1"}
    assert os.environ["MASTER_PORT"] == str(slurm.rendezvous_port("4242")) != LOGIN_SHELL["MASTER_PORT"]
    assert "TORCHELASTIC_USE_AGENT_STORE" not in os.environ
    assert slurm.rendezvous_port("4242") != slurm.rendezvous_port("4243")  # jobs submitted together share no port
    environ = {"CUDA_VISIBLE_DEVICES": "9"}
    slurm.restrict_gpus("cuda", environ)
    assert "CUDA_VISIBLE_DEVICES" not in environ  # the login shell's choice, not SLURM's: every GPU of the node
    environ = {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"}
    slurm.restrict_gpus("cuda", environ)
    assert environ["CUDA_VISIBLE_DEVICES"] == "2,3"  # SLURM's own


def test_a_tasks_threads_are_its_cpus_less_its_loader_workers():
    run = Run("x", "a", {"train": {"num_workers": 8}})
    assert slurm.task_threads(run, {"SLURM_CPUS_PER_TASK": "10"}) == 2
    assert slurm.task_threads(run, {"SLURM_CPUS_PER_TASK": "4"}) == 1


# ---------------------------------------------------------------------------- jobs that run
@pytest.fixture(scope="module")
def rehearsal_data(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("rehearsal") / "imagenet")


def _short_run(data: Path) -> Run:
    """A rehearsal run of the head ablation, 40 steps of 2 processes, a metrics line every 2 steps; no
    validation split and no evaluation during training (the final weights are the result)."""
    run = ABLATIONS["head"].runs(get_scale("rehearsal", str(data)))[0]
    train = {**run.config["train"], "val_size": 0, "eval_every": 0, "keep_best": False, "log_every": 2}
    return Run(run.ablation, run.label, {**run.config, "train": train}, run.seed, run.group)


@pytest.mark.slow
def test_cpu_jobs_train_to_the_end_and_a_preempted_one_resumes_to_the_same_loss(cluster, rehearsal_data, tmp_path,
                                                                                   monkeypatch):
    for name, value in LOGIN_SHELL.items():  # sbatch exports the submitting shell's environment to the jobs
        monkeypatch.setenv(name, value)
    run = _short_run(rehearsal_data)
    cpu = assign("cpu", "slurm", processes_per_run=2)
    options = SlurmOptions(cpus_per_task=2)  # one loader worker: one torch thread each
    whole, preempted = ResultStore(tmp_path / "whole"), ResultStore(tmp_path / "preempted")
    for store in (whole, preempted):  # both at once: they share the node, each on its own port
        slurm.submit([run], measure, store, cpu, options, wait=False, minutes=lambda r: 5.0, quiet=True)
    whole_job, job = (job_of(s, run) for s in (whole, preempted))
    metrics = run_folder(preempted, run) / "train" / "metrics.jsonl"
    deadline = time.time() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):  # training is under way
        assert time.time() < deadline and cluster.job(job) in ("PENDING", "RUNNING"), "the job did not start training"
        time.sleep(0.1)
    subprocess.run(["scancel", "--signal=USR2", job], check=True)  # SLURM's warning before a limit or preemption
    for store in (whole, preempted):  # the suite's wait collects both
        thread, outcome = waiting(slurm.submit, [run], measure, store, cpu, options, wait=True, minutes=lambda r: 5.0,
                                  quiet=True, poll_s=0.3)
        thread.join(300)
        assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    assert cluster.job(job, "restarts") == "1" and cluster.job(whole_job, "restarts") == "0"
    assert [r["restart"] for r in cluster.asked("srun") if r["job_id"] == job] == [0, 1]
    logs = {j: "".join(p.read_text() for p in (tmp_path / s / "jobs").glob(f"{j}_*_log.err"))
            for j, s in ((whole_job, "whole"), (job, "preempted"))}
    assert "resuming run" in logs[job] and "resuming run" not in logs[whole_job]
    for job_id in (whole_job, job):  # the job's own rendezvous, none of the login shell's variables
        assert f"rendezvous 127.0.0.1:{slurm.rendezvous_port(job_id)}" in logs[job_id]
        assert "rank 1 of 2" in logs[job_id] and "CUDA_VISIBLE_DEVICES=9" not in logs[job_id]
    record, again = whole.get(run.key), preempted.get(run.key)
    assert record["launcher"] == "slurm" and record["world_size"] == 2 and record["job_id"] == whole_job
    assert record["threads"] == 1  # SLURM_CPUS_PER_TASK less the loader worker, not the submitting machine's
    summary = json.loads((run_folder(preempted, run) / "train" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 40
    # resumed exactly: the same final loss and test accuracy as the job that was never stopped
    assert again["metrics"]["final_loss"] == pytest.approx(record["metrics"]["final_loss"], abs=1e-6)
    assert again["metrics"]["test_acc"] == record["metrics"]["test_acc"]


def fail_on_rank_1(run, device, out):
    """Rank 1 fails once the process group exists; rank 0 waits for it as a rank waits in an NCCL
    collective whose peer is gone: for ever (gloo would notice the closed connection)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.distributed_c10d._get_default_store().wait(["never set"], datetime.timedelta(seconds=600))


@pytest.mark.slow
def test_a_failing_rank_ends_its_job_and_the_suite_says_why(cluster, tmp_path):
    run = Run("head", "failing", {"train": {}}, 0)
    store = ResultStore(tmp_path / "results")
    thread, outcome = waiting(slurm.submit, [run], fail_on_rank_1, store, assign("cpu", "slurm", processes_per_run=2),
                              SlurmOptions(), wait=True, minutes=lambda r: 5.0, quiet=True, poll_s=0.3)
    thread.join(400)  # rank 0 alone would wait 600 s
    assert not thread.is_alive(), "the suite still waits for a job whose rank 1 failed"
    said = str(outcome["error"])
    assert outcome["seconds"] < 300 and "ended (FAILED) without storing a result" in said
    assert "task 1 (rank 1) failed first" in said and "rank 1 fails on purpose" in said
    assert cluster.job(job_of(store, run)) == "FAILED"  # every task ended: srun killed the waiting rank 0


def stored_elsewhere(run, device, out):  # never runs: its job is held
    return {"metrics": {}}


def test_a_job_slurm_no_longer_knows_is_not_waited_for_for_ever_and_is_submitted_again(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_STANDIN_HOLD", "1")
    (cluster.state / "unknown").write_text("*")  # sacct knows none of its jobs
    runs = [Run("head", "lost", {"train": {}}, 0), Run("head", "stored", {"train": {}}, 1)]
    store, cpu = ResultStore(tmp_path / "results"), assign("cpu", "slurm", processes_per_run=2)
    slurm.submit(runs, stored_elsewhere, store, cpu, SlurmOptions(), wait=False, minutes=lambda r: 5.0, quiet=True)
    store.add({"key": runs[1].key, "numerics": store.numerics})  # what is on disk decides: this one stored its result
    thread, outcome = waiting(slurm.submit, runs, stored_elsewhere, store, cpu, SlurmOptions(), wait=True,
                              minutes=lambda r: 5.0, quiet=True, poll_s=0.3, unsure_s=1.5)
    thread.join(30)
    assert not thread.is_alive(), "the suite polls a job in state UNKNOWN for ever"
    said = str(outcome["error"])
    assert "'lost' seed 0 is lost: its state has been UNKNOWN for 2 s" in said and "'stored'" not in said
    assert "submits this run again" in said
    slurm.submit(runs, stored_elsewhere, store, cpu, SlurmOptions(), wait=False, minutes=lambda r: 5.0, quiet=True)
    assert [e["job_id"] for e in cluster.asked("sbatch")] == ["1000", "1001", "1002"]  # the lost one, once more
