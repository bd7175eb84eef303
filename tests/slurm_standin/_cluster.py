"""A stand-in SLURM cluster of one node, for rehearsing the benchmarks' SLURM path without SLURM.

The commands beside this file (sbatch, srun, sacct, scontrol, scancel) are what tests put first on
PATH. Jobs run here as processes with the environment SLURM gives them; each job's state lives
under $SLURM_STANDIN_STATE (required):

    STATE/sbatch.jsonl, srun.jsonl   every sbatch script and srun command line, in order
    STATE/jobs/<id>/                 state, options.json, batch.sh, restarts, and while it runs:
                                     runner, group (the batch script's process group), tasks

It honours the #SBATCH options submitit writes (tasks, CPUs, GPUs, --requeue, --output and --error
with %j and %t; a time limit and --signal are recorded, not enforced); srun's --cpus-per-task (else
1 CPU a task, as Slurm 22.05-23.02) and --kill-on-bad-exit; signals to srun reach its tasks;
`scontrol requeue` (refused without --requeue) restarts the batch script with SLURM_RESTART_COUNT
+ 1; `scancel --signal=SIG`. With $SLURM_STANDIN_HOLD=1 a job stays PENDING, never run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

VALUED = {"output", "error", "cpus-per-task", "ntasks", "nodes", "ntasks-per-node", "mem",
          "partition", "signal", "p", "o", "j", "s", "time", "job-name"}
KILL_WAIT_S = 2.0


def state_dir() -> Path:
    if not os.environ.get("SLURM_STANDIN_STATE"):
        sys.exit("stand-in SLURM: set SLURM_STANDIN_STATE to the folder of its jobs")
    return Path(os.environ["SLURM_STANDIN_STATE"])


def job_dir(job_id: str) -> Path:
    return state_dir() / "jobs" / str(job_id)


def read(job_id: str, name: str, default: str = "") -> str:
    path = job_dir(job_id) / name
    return path.read_text().strip() if path.exists() else default


def write(job_id: str, name: str, text: str) -> None:
    tmp = job_dir(job_id) / f".{name}.{os.getpid()}"
    tmp.write_text(text)
    os.replace(tmp, job_dir(job_id) / name)


def log(name: str, entry: dict) -> None:
    with open(state_dir() / name, "a") as f:
        f.write(json.dumps(entry) + "\n")


def options(args: list[str]) -> tuple[dict, list[str]]:
    """--key=value, --key value (for options that take one) and --flag, up to the first word."""
    found, i = {}, 0
    while i < len(args) and args[i].startswith("-"):
        key, has, value = args[i].lstrip("-").partition("=")
        if not has and key in VALUED and i + 1 < len(args):
            value, i = args[i + 1], i + 1
        found[key] = value if has or key in VALUED else True
        i += 1
    return found, args[i:]


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_group(group: int) -> None:
    """SIGTERM to a job's processes, SIGKILL to what is left after KILL_WAIT_S."""
    deadline = time.time() + KILL_WAIT_S
    try:
        os.killpg(group, signal.SIGTERM)
        while time.time() < deadline:
            os.killpg(group, 0)
            time.sleep(0.05)
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sbatch(args: list[str]) -> int:
    opts, rest = options(args)
    script = Path(rest[0]).read_text()
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            opts.update(options(line.split(None, 1)[1:])[0])
    state_dir().joinpath("jobs").mkdir(parents=True, exist_ok=True)
    job_id = str(1000 + len(list(state_dir().joinpath("jobs").iterdir())))
    while True:  # a fresh id, whoever else submits at once
        try:
            job_dir(job_id).mkdir()
            break
        except FileExistsError:
            job_id = str(int(job_id) + 1)
    (job_dir(job_id) / "batch.sh").write_text(script)
    write(job_id, "options.json", json.dumps({**opts, "submit_dir": os.getcwd()}))
    write(job_id, "state", "PENDING")
    log("sbatch.jsonl", {"job_id": job_id, "argv": args, "script": script, "options": opts})
    print(f"Submitted batch job {job_id}", flush=True)
    if os.environ.get("SLURM_STANDIN_HOLD") != "1":  # with the submitting shell's environment
        subprocess.Popen([sys.executable, str(Path(__file__)), "run-job", job_id],
                         start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return 0


def expand(pattern: str, job_id: str, task: int) -> str:
    return pattern.replace("%%", "\0").replace("%j", job_id).replace("%t", str(task)).replace(
        "\0", "%")


def job_environment(job_id: str, opts: dict, restarts: int) -> dict:
    tasks = int(opts.get("nodes", 1)) * int(opts.get("ntasks-per-node", opts.get("ntasks", 1)))
    env = {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id,
           "SLURM_JOB_NAME": str(opts.get("job-name", "")), "SLURM_JOB_NUM_NODES": "1",
           "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": socket.gethostname(),
           "SLURM_NTASKS": str(tasks), "SLURM_NPROCS": str(tasks),
           "SLURM_NTASKS_PER_NODE": str(tasks), "SLURM_SUBMIT_DIR": opts["submit_dir"],
           "SLURM_CLUSTER_NAME": "standin",
           "SLURM_JOB_PARTITION": str(opts.get("partition", "standin"))}
    if "cpus-per-task" in opts:
        env["SLURM_CPUS_PER_TASK"] = str(opts["cpus-per-task"])
    if restarts:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    if gpus := int(opts.get("gpus-per-node", 0) or 0):  # SLURM's own, over the shell's
        env["SLURM_JOB_GPUS"] = env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(gpus)))
    return env


def run_job(job_id: str) -> int:
    """The controller and the node in one: runs the batch script, and again when requeued."""
    opts, restarts = json.loads(read(job_id, "options.json")), 0
    write(job_id, "runner", str(os.getpid()))
    while True:
        write(job_id, "restarts", str(restarts))
        write(job_id, "state", "RUNNING")
        streams = [open(expand(str(opts.get(name, os.devnull)), job_id, 0), "a")
                   for name in ("output", "error")]
        batch = subprocess.Popen(["bash", str(job_dir(job_id) / "batch.sh")],
                                 env=job_environment(job_id, opts, restarts), stdout=streams[0],
                                 stderr=streams[1], cwd=opts["submit_dir"], start_new_session=True)
        write(job_id, "group", str(batch.pid))
        while batch.poll() is None and not (job_dir(job_id) / "requeue").exists():
            time.sleep(0.1)
        requeued = (job_dir(job_id) / "requeue").exists()
        if requeued:
            end_group(batch.pid)
        batch.wait()
        for stream in streams:
            stream.close()
        (job_dir(job_id) / "tasks").unlink(missing_ok=True)
        if not requeued:
            write(job_id, "exit_code", str(batch.returncode))
            write(job_id, "state", "COMPLETED" if batch.returncode == 0 else "FAILED")
            return 0
        (job_dir(job_id) / "requeue").unlink()
        write(job_id, "state", "REQUEUED")
        restarts += 1


def srun(args: list[str]) -> int:
    """One step of the job: a process per task, with SLURM's variables for each."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        sys.exit("srun: error: the stand-in runs srun only inside its jobs")
    opts, command = options(args)
    log("srun.jsonl", {"job_id": job_id, "argv": args,
                       "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0))})
    ntasks, tasks, files = int(os.environ["SLURM_NTASKS"]), [], []
    for task in range(ntasks):
        env = {**os.environ, "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
               "SLURM_NODEID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": str(ntasks),
               "SLURM_CPUS_PER_TASK": str(opts.get("cpus-per-task", 1))}
        files += [open(expand(str(opts.get(name, os.devnull)), job_id, task), "a")
                  for name in ("output", "error")]
        tasks.append(subprocess.Popen(command, env=env, stdout=files[-2], stderr=files[-1]))
    write(job_id, "tasks", " ".join(str(t.pid) for t in tasks))

    def forward(signum, frame):
        signal_all([t.pid for t in tasks if t.poll() is None], signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT):
        signal.signal(sig, forward)
    kill = str(opts.get("kill-on-bad-exit", "0")) in ("1", "True")
    while any(t.poll() is None for t in tasks):
        if kill and any(t.poll() not in (None, 0) for t in tasks):
            live = [t for t in tasks if t.poll() is None]
            signal_all([t.pid for t in live], signal.SIGTERM)
            deadline = time.time() + KILL_WAIT_S
            while time.time() < deadline and any(t.poll() is None for t in live):
                time.sleep(0.05)
            for t in live:
                t.kill()
        time.sleep(0.05)
    for f in files:
        f.close()
    return next((c if c > 0 else 128 - c for c in (t.returncode for t in tasks) if c), 0)


def sacct(args: list[str]) -> int:
    ids, fields = [], ["JobID", "State"]
    for flag, value in zip(args, args[1:]):
        if flag in ("-j", "--jobs"):
            ids += value.split(",")
        elif flag in ("-o", "--format"):
            fields = value.split(",")
    if "-n" not in args and "--noheader" not in args:
        print("|".join(fields))
    for job_id in (j for j in ids if job_dir(j).is_dir()):
        values = {"JobID": job_id, "State": read(job_id, "state"), "NodeList": socket.gethostname(),
                  "ExitCode": f"{read(job_id, 'exit_code', '0')}:0"}
        print("|".join(values.get(f, "") for f in fields))
    return 0


def scontrol(args: list[str]) -> int:
    """scontrol requeue ID, the one call submitit makes."""
    job_id = [a for a in args if not a.startswith("-")][1]
    if "requeue" not in json.loads(read(job_id, "options.json")):
        print(f"Requested operation is presently disabled for job {job_id}", file=sys.stderr)
        return 1
    (job_dir(job_id) / "requeue").touch()
    return 0


def scancel(args: list[str]) -> int:
    """scancel --signal=SIG ID...: the signal to the tasks of the running step."""
    sig = next(a.partition("=")[2] for a in args if a.startswith("--signal="))
    for job_id in (a for a in args if not a.startswith("-")):
        signal_all([int(p) for p in read(job_id, "tasks").split()], getattr(signal, "SIG" + sig))
    return 0


def shutdown(state: Path) -> None:
    """End every job of a stand-in cluster still running (a test's teardown)."""
    for job in (state / "jobs").iterdir() if (state / "jobs").is_dir() else []:
        for name, kill in (("runner", os.kill), ("group", os.killpg)):
            if (job / name).exists():
                try:
                    kill(int((job / name).read_text()), signal.SIGKILL)
                except (ProcessLookupError, PermissionError, ValueError):
                    pass


COMMANDS = {"sbatch": sbatch, "srun": srun, "sacct": sacct, "scontrol": scontrol,
            "scancel": scancel}

if __name__ == "__main__":  # python _cluster.py run-job ID: the job's own process
    sys.exit(run_job(sys.argv[2]))
