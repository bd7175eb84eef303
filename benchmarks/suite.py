"""The machinery every ablation shares: runs keyed by their config, a results store that survives
interruption, the environment a number was measured in, and a progress bar with an overall ETA."""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import multiprocessing
import os
import platform
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch
from tqdm import tqdm

from vitzoo.io import write_text
from vitzoo.train.distributed import pick_device

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Run:
    """One measurement: a model (vitzoo option names), how it is trained, and a seed."""

    ablation: str
    label: str  # what the row is called in tables and figures
    config: dict[str, Any]  # every model and training option
    seed: int = 0
    group: dict[str, Any] = field(default_factory=dict)  # the ablation's own coordinates (cell, lr, ...)

    @property
    def key(self) -> str:
        """Identifies the result: a hash of the ablation, config and seed (not of the label)."""
        text = json.dumps({"ablation": self.ablation, "config": self.config, "seed": self.seed}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=10)
        # results written by the run itself do not make the code it measured dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                                ":(top,exclude)benchmarks/results"], capture_output=True,
                               text=True, cwd=Path(__file__).parent, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model() -> str:
    """The CPU's model name and family (Linux: /proc/cpuinfo), e.g. "AMD EPYC (family 25)": machines of
    one size differ in CPU, and a number is only comparable beside its CPU."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name = fields.get("model name", platform.machine())
    return f"{name} (family {fields['cpu family']})" if "cpu family" in fields else name


# the instruction sets the CPU's matrix and element-wise kernels dispatch on (oneDNN, PyTorch's vectorised
# kernels): two CPUs of one name and family can still differ here, and bf16 speed hangs on the last four
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_fp16", "sve", "bf16")


def cpu_flags() -> list[str]:
    """The CPU_FLAGS this CPU has (Linux: /proc/cpuinfo's flags, or Features on ARM), in that order;
    elsewhere the vector width PyTorch dispatches to (torch.backends.cpu.get_cpu_capability())."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return [torch.backends.cpu.get_cpu_capability().lower()]
    line = next((line for line in info.splitlines() if line.split(":")[0].strip() in ("flags", "Features")), "")
    present = set(line.split(":", 1)[-1].split())
    return [flag for flag in CPU_FLAGS if flag in present]


def gpu_name(device: str) -> str | None:
    """The name of the GPU `device` stands for (`auto`, `cuda`, `cuda:1`), or None off CUDA."""
    if not torch.cuda.is_available():
        return None
    where = pick_device(device)
    return torch.cuda.get_device_name(where) if where.type == "cuda" else None


def environment(device: str) -> dict[str, Any]:
    """Where and when a number was measured: recorded with every result of every benchmark (on CUDA
    with the GPU's name: "cuda" alone does not say which GPU; the CPU with its family and the
    instruction sets its kernels use, which decide how its numbers compare with another CPU's)."""
    gpu = gpu_name(device)
    return {
        "device": device,
        **({"gpu": gpu} if gpu else {}),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


class ResultStore:
    """`results.json` of one ablation: {"runs": [...]}, shared by every process that measures its runs.

    Each `add` takes the store's lock (an flock on `results.json.lock`), reads what other processes added
    meanwhile, merges the record in and writes the file atomically: two suites on one `--out`, or the
    jobs of a cluster, each keep every result. `runs` is what the file held at the last read or add;
    `order`, if given, sorts the records as they are written (a key function of a record).
    """

    def __init__(self, directory: Path, order: Callable[[dict[str, Any]], Any] | None = None) -> None:
        self.directory = Path(directory)
        self.order = order
        self.path = self.directory / "results.json"
        self.runs: list[dict[str, Any]] = self._read()

    def _read(self) -> list[dict[str, Any]]:
        return json.loads(self.path.read_text())["runs"] if self.path.exists() else []

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock (blocking): the only writer while it is held."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "results.json.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def refresh(self) -> None:
        """Read the results other processes have added since."""
        self.runs = self._read()

    def get(self, key: str) -> dict[str, Any] | None:
        return next((r for r in self.runs if r["key"] == key), None)

    def add(self, record: dict[str, Any]) -> None:
        with self.locked():
            self.runs = [r for r in self._read() if r["key"] != record["key"]] + [record]
            if self.order is not None:
                self.runs.sort(key=self.order)
            write_text(self.path, json.dumps({"runs": self.runs}, indent=1, sort_keys=True) + "\n")


def make_record(run: Run, outcome: dict[str, Any], wall_s: float, device: str, **launch: Any) -> dict[str, Any]:
    """What the store keeps of a measured run: its key and settings, the outcome, its wall time, how it
    was launched (launcher, processes, `started`: the Unix time it began), and its environment."""
    return {"key": run.key, "ablation": run.ablation, "label": run.label, "group": run.group, "config": run.config,
            "seed": run.seed, "wall_s": round(wall_s, 2), **outcome, **launch, **environment(device)}


def run_folder(store: ResultStore, run: Run) -> Path:
    """Where a run trains and keeps its checkpoints, final weights and logs (ignored by git: runs/)."""
    return store.directory / "runs" / run.key


def _measured(measure: Callable[..., dict[str, Any]], run: Run, device: str, out: Path, threads: int | None) -> dict[str, Any]:
    """One run measured in this process (one of several workers when `threads` is given), with its wall time."""
    if threads is not None:
        torch.set_num_threads(threads)
    started, start = time.time(), time.perf_counter()
    outcome = measure(run, device=device, out=out)
    return {"outcome": outcome, "wall_s": time.perf_counter() - start, "started": started}


def execute(
    runs: Iterable[Run],
    measure: Callable[..., dict[str, Any]],
    store: ResultStore,
    assignment: Any,
    quiet: bool = False,
    slurm: Any = None,
    wait: bool = True,
    minutes: Callable[[Run], float] | None = None,
) -> list[dict[str, Any]]:
    """Measure every run that has no result yet, as `assignment` (benchmarks.launchers.assign) says;
    return the records of all runs measured so far, in order.

    `measure(run, device=..., out=...)` returns {"metrics": {...}, "flops": ..., ...} for the run trained
    in its folder `out`; wall time, launch and environment are added here. Records already in the store
    (of this process or any other) are reused, so an interrupted suite continues. On the CPU with one
    process per run, runs go at once in that many worker processes (one CPU thread each on 2 cores); a
    run of several processes, or on GPUs, is one data-parallel job through the elastic launcher, one per
    GPU set at once (`benchmarks.launchers.local`); under SLURM each run is submitted as a job
    (`benchmarks.launchers.slurm`, with `slurm` its options, `minutes(run)` its planned time), and the
    suite waits for them unless `wait` is False. Each result is stored as soon as it arrives.
    """
    from benchmarks.launchers import local

    runs = list(runs)
    store.refresh()
    todo = [run for run in runs if store.get(run.key) is None]
    if assignment.launcher != "local":
        from benchmarks.launchers import slurm as cluster

        cluster.submit(todo, measure, store, assignment, slurm or cluster.SlurmOptions(), wait, minutes, quiet)
        store.refresh()
        return [{**store.get(run.key), "label": run.label, "group": run.group} for run in runs if store.get(run.key)]
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc=runs[0].ablation if runs else "",
               unit="run", disable=quiet, dynamic_ncols=True)
    launch = {"launcher": "local", "processes": assignment.processes_per_run}

    def done(run: Run, result: dict[str, Any]) -> None:
        store.add(make_record(run, result["outcome"], result["wall_s"], assignment.device, **launch,
                              started=round(result["started"], 3), **({"gpus": result["slot"]} if result.get("slot") else {})))
        bar.set_postfix_str(f"{run.label} seed {run.seed}")
        bar.update(1)

    def pending() -> list[Run]:  # what no other process has measured meanwhile
        store.refresh()
        return [run for run in todo if store.get(run.key) is None]

    device = assignment.device
    in_process = assignment.device == "cpu" and assignment.processes_per_run == 1
    if len(assignment.slots) <= 1 or len(todo) <= 1:
        for run in todo:
            if store.get(run.key) is None:
                if in_process:
                    done(run, _measured(measure, run, device, run_folder(store, run), None))
                else:
                    done(run, local.timed_launch(measure, run, run_folder(store, run), assignment, assignment.slots[0]))
                store.refresh()
    elif in_process:
        # spawn, not fork: a forked child of a process that has used OpenMP threads can hang
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=len(assignment.slots), mp_context=context) as pool:
            futures = {pool.submit(_measured, measure, run, device, run_folder(store, run),
                                   assignment.threads_per_process): run for run in pending()}
            for future in as_completed(futures):
                done(futures[future], future.result())
    else:
        for run, result in local.launch_at_once(measure, pending(), lambda run: run_folder(store, run), assignment):
            done(run, result)
    bar.close()
    store.refresh()
    # labels are presentation: they follow the current plan, even for results measured earlier
    return [{**store.get(run.key), "label": run.label, "group": run.group} for run in runs if store.get(run.key)]


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def save_figure(fig, path: Path) -> None:
    """PNG written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    os.replace(tmp, path)


def _proc_status_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise KeyError(field_name)


def resident_memory_gb() -> float:
    """The process's resident memory now (Linux)."""
    return _proc_status_kb("VmRSS") / 2**20


def peak_memory_growth_gb(fn: Callable[[], object], since_gb: float | None = None) -> float:
    """Peak resident memory while `fn` runs, above `since_gb` (default: what the process holds just
    before it). Linux: the high-water mark is reset through /proc/self/clear_refs first, so earlier
    peaks do not count."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = resident_memory_gb() if since_gb is None else since_gb
    fn()
    return _proc_status_kb("VmHWM") / 2**20 - before
