"""What an ablation will cost before it starts: the training FLOPs of its runs, and their minutes
on the assignment the launchers use, as `--dry-run` prints them.

A run's time: its training images at the speed of one process (a short probe on the device, in
the run's precision, at its micro-batch; for GPUs not here, a stated TFLOP/s) times its processes,
its evaluations at a third of that work, and a stated start. A run of image files trains no
faster than its loader workers decode (the `loader` benchmark's record). The budget test plans
with a recorded probe (THROUGHPUT: `python -m benchmarks.plan --record` on a quiet machine).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from dataclasses import dataclass

import torch

import vitzoo
from benchmarks.assignment import Assignment
from benchmarks.machine import environment
from benchmarks.spec import Ablation, Scale
from benchmarks.suite import RESULTS, Run, markdown_table
from benchmarks.training import DATASET_IMAGES, dataset_images, model_options, train_images
from vitzoo.io import write_text

PARALLEL_SLOWDOWN = 1.2  # two one-thread workers on two cores share memory bandwidth
FORWARD_SHARE = 1 / 3  # a forward pass: about a third of a training step's FLOPs
STATED_GPU_TFLOPS = 125.0  # an A100 in bf16 at ~40% of its peak, as a ViT trains
THROUGHPUT = RESULTS / "plan" / "throughput.json"
LOADER = RESULTS / "loader" / "results.json"
BUILD_S = 4.0  # stated: the data's index read, the model built, the optimizer made
RENDEZVOUS_S = {"cuda": 30.0, "cpu": 5.0}  # stated: a run's processes started and met
DECODED_BY_PIL = ("oxford-pets", "flowers102")  # torchvision's datasets of files


def trainings(run: Run) -> list[dict]:
    """The run's training and its further ones (`more_train`: a fine-tuning, a sweep)."""
    return [run.config["train"], *run.config.get("more_train", ())]


def work(train: dict) -> tuple[int, int]:
    """(images trained on, images evaluated) of one training: its steps' batches; its evaluations
    meanwhile, then the test set and its few-shot features."""
    n_test = dataset_images(train)[1]
    n_test = min(n_test, train.get("test_limit") or n_test)
    epoch = train_images(train) // train["batch_size"]
    steps = train.get("steps") or max(1, round(train.get("epochs", 10) * epoch))
    evaluations = steps // train["eval_every"] if train.get("eval_every") else 0
    return steps * train["batch_size"], evaluations * (train.get("val_size") or n_test) + 2 * n_test


def training_flops(run: Run) -> float:
    return image_flops(_model_key(run)) * sum(work(train)[0] for train in trainings(run))


def _model_key(run: Run) -> str:
    train = run.config["train"]  # the images of one forward pass
    return json.dumps({"model": run.config["model"], "options": model_options(run),
                       "batch": train.get("micro_batch") or train["batch_size"]}, sort_keys=True)


@functools.lru_cache(maxsize=None)
def _config(model_key: str):
    spec = json.loads(model_key)
    return vitzoo.get_config(spec["model"], **spec["options"])


@functools.lru_cache(maxsize=None)
def image_flops(model_key: str) -> float:
    return float(vitzoo.count_flops(_config(model_key), backward=True))


def run_precision(run: Run, device: str) -> str:
    """The dtype the run trains in on `device`, resolved as training resolves it."""
    from benchmarks.training import train_settings
    from vitzoo import precision

    dtype = precision.training_dtype(train_settings(run.config)["precision"], torch.device(device))
    return precision.NAMES[dtype or torch.float32]


class OutOfMemory(RuntimeError):
    """The probe's micro-batch does not fit on the GPU."""


@functools.lru_cache(maxsize=None)
def probe_images_per_s(model_key: str, device: str, threads: int,
                       precision: str = "float32") -> float:
    """Training images/s of one process: the fastest of 4 AdamW steps after a warm-up, on
    random data, in the run's precision (TF32 on CUDA), as training runs."""
    from vitzoo.precision import autocast

    spec, where, previous = json.loads(model_key), torch.device(device), torch.get_num_threads()
    torch.set_num_threads(threads)
    if where.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    sync = (lambda: torch.cuda.synchronize(where)) if where.type == "cuda" else (lambda: None)
    dtype = None if precision == "float32" else getattr(torch, precision)
    try:
        model = vitzoo.create(spec["model"], **spec["options"]).to(where)
        cfg, batch, times = model.config, spec["batch"], []
        x = torch.randn(batch, cfg.in_chans, *cfg.img_size, device=where)
        y = torch.randint(0, cfg.num_classes or 10, (batch,), device=where)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(5):
            sync()
            start = time.perf_counter()
            with autocast(where, dtype):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - start)
        return batch / min(times[1:])  # the fastest: what the model costs, not what others took
    except torch.OutOfMemoryError:
        raise OutOfMemory(f"{spec['model']} at micro-batch {spec['batch']} in {precision} does "
                          f"not fit on {device}; lower the run's micro_batch") from None
    finally:
        model = optimizer = x = None
        if where.type == "cuda":
            torch.cuda.empty_cache()
        torch.set_num_threads(previous)


def device_images_per_s(run: Run, assignment: Assignment, gpu_tflops: float) -> float:
    """One process's training images/s: stated for GPUs not here, else probed."""
    key = _model_key(run)
    if assignment.device == "cuda" and not assignment.present:
        return gpu_tflops * 1e12 / image_flops(key)
    return probe_images_per_s(key, assignment.device, assignment.threads_per_process,
                              run_precision(run, assignment.device))


@functools.lru_cache(maxsize=None)
def recorded_loader() -> dict:
    return json.loads(LOADER.read_text())


def loader_rates(train: dict, img_size: int, processes: int) -> tuple[float, float] | None:
    """Images/s a training's loader workers feed it, and its evaluations (the recorded rate of one
    worker at the nearest size, times its workers); None for tensors in memory."""
    name = train.get("data", "fashion-mnist")
    if name in DATASET_IMAGES and name not in DECODED_BY_PIL:
        return None
    pipeline = min(recorded_loader()["pipelines"], key=lambda p: abs(p["img_size"] - img_size))
    rates, workers = pipeline["images_per_s"], max(train.get("num_workers", 0), 1) * processes
    return (rates["pil" if name in DECODED_BY_PIL else "torchvision.io"] * workers,
            rates["evaluation"] * workers)


def run_time(run: Run, assignment: Assignment, gpu_tflops: float) -> tuple[float, str]:
    """(wall seconds on its share of the assignment, what its training waits for: the device,
    "GPU" or "CPU", or "loader")."""
    processes = assignment.processes_per_run
    rate = device_images_per_s(run, assignment, gpu_tflops) * processes
    img_size = int(_config(_model_key(run)).img_size[0])
    bound = "GPU" if assignment.device == "cuda" else "CPU"
    start = BUILD_S + (RENDEZVOUS_S[assignment.device] if processes > 1 else 0.0)
    seconds = start
    for train in trainings(run):
        trained, evaluated = work(train)
        training, evaluating = trained / rate, FORWARD_SHARE * evaluated / rate
        if (fed := loader_rates(train, img_size, processes)) is not None:
            if trained / fed[0] > training:
                bound, training = "loader", trained / fed[0]
            evaluating = max(evaluating, evaluated / fed[1])
        seconds += training + evaluating
    return seconds, bound


@dataclass(frozen=True)
class AblationPlan:
    name: str
    runs: int
    to_measure: int
    flops: float
    minutes: float  # of the runs still to measure (under SLURM: the longest run's)
    budget_min: float | None
    longest_run_min: float = 0.0
    device_hours: float = 0.0  # GPU-hours (CPU: process-hours)
    problem: str = ""  # what stops a run, instead of an estimate
    bound: str = ""  # what the runs' training waits for
    loader_bound_runs: int = 0


def plan_ablation(spec: Ablation, scale: Scale, done: set[str], assignment: Assignment,
                  gpu_tflops: float = STATED_GPU_TFLOPS) -> AblationPlan:
    """The ablation's runs still to measure, their FLOPs and time on `assignment`."""
    threads = assignment.keyed_threads(spec.trains)
    runs = [dataclasses.replace(r, threads=threads) for r in spec.runs(scale)]
    todo = [r for r in runs if r.key not in done]
    if not spec.trains:  # timings: a few seconds a point, one at a time
        return AblationPlan(spec.name, len(runs), len(todo), 0.0, len(todo) / 3, scale.budget_min)
    flops = sum(training_flops(r) for r in runs)
    try:
        times = [run_time(r, assignment, gpu_tflops) for r in todo]
    except OutOfMemory as exc:
        return AblationPlan(spec.name, len(runs), len(todo), flops, float("nan"),
                            scale.budget_min, problem=str(exc))
    seconds = [t[0] for t in times]
    minutes = longest = max(seconds, default=0.0) / 60
    if assignment.runs_at_once is not None:  # else SLURM's: the longest run bounds the time
        at_once = assignment.runs_at_once if spec.parallel else 1
        slowdown = PARALLEL_SLOWDOWN if at_once > 1 and assignment.device == "cpu" else 1.0
        minutes = sum(seconds) / at_once * slowdown / 60
    loader = sum(t[1] == "loader" for t in times)
    return AblationPlan(spec.name, len(runs), len(todo), flops, minutes, scale.budget_min, longest,
                        sum(seconds) * assignment.processes_per_run / 3600,
                        bound=bound_of(loader, len(times), times[0][1] if times else ""),
                        loader_bound_runs=loader)


def bound_of(loader_runs: int, runs: int, device: str) -> str:
    if not runs or not loader_runs:
        return device if runs else ""
    return "loader" if loader_runs == runs else f"loader ({loader_runs} of {runs} runs)"


def describe(plans: list[AblationPlan], scale: Scale, assignment: Assignment,
             gpu_tflops: float) -> str:
    def within(minutes: float, budget: float | None) -> str:
        return "" if budget is None else f"{'within' if minutes <= budget else 'OVER'} {budget:g}"

    gpus = assignment.device == "cuda"
    rows = [[p.name, p.runs, p.to_measure, f"{p.flops:.3g}",
             "n/a" if p.problem else f"{p.minutes:.1f}", f"{p.longest_run_min:.1f}",
             f"{p.device_hours:.1f}", within(p.minutes, p.budget_min), p.bound] for p in plans]
    timed = [p.minutes for p in plans if not p.problem]
    total = sum(timed) if assignment.runs_at_once is not None else max(timed, default=0.0)
    rows.append(["all", sum(p.runs for p in plans), sum(p.to_measure for p in plans),
                 f"{sum(p.flops for p in plans):.3g}", f"{total:.1f}",
                 f"{max((p.longest_run_min for p in plans), default=0.0):.1f}",
                 f"{sum(p.device_hours for p in plans):.1f}", within(total, scale.suite_budget_min),
                 bound_of(sum(p.loader_bound_runs for p in plans),
                          sum(p.to_measure for p in plans if p.bound), "GPU" if gpus else "CPU")])
    how = (f"at a stated {gpu_tflops:g} TFLOP/s per GPU (--gpu-tflops) on --gpus per node"
           if gpus and not assignment.present else
           f"from a measured throughput probe on {assignment.device_name}")
    if scale.train.get("data") == "imagenet":
        how += ", ImageNet-1k's size assumed"
    if any(p.bound.startswith("loader") for p in plans):
        how += (f"; loaders at the recorded rate of one worker "
                f"({recorded_loader()['environment']['cpu']}) x num_workers x processes")
    text = (f"Plan at `--scale {scale.name}`, {how}; {assignment.describe()}; a run starts in "
            f"{BUILD_S:g} s, +{RENDEZVOUS_S['cuda']:g} s on GPUs (+{RENDEZVOUS_S['cpu']:g} s on "
            "the CPU) for several processes (stated):\n\n" + markdown_table(
                ["ablation", "runs", "to measure", "training FLOPs", "minutes", "longest run (min)",
                 "GPU-hours" if gpus else "process-hours", "budget (min)", "bound"], rows))
    text += "".join(f"\n\n**{p.name} cannot run as planned**: {p.problem}"
                    for p in plans if p.problem)
    if scale.suite_budget_min is not None and total > scale.suite_budget_min:
        text += (f"\n\n**Over budget: {total / 60:.1f} h planned, the scale's budget is "
                 f"{scale.suite_budget_min / 60:g} h on this assignment.**")
    return text


def record_throughput(scales: tuple[str, ...] = ("main", "cpu")) -> dict:
    """Probe every model the scales train, in one thread (as two workers of a 2-core machine)."""
    from benchmarks.ablations import ABLATIONS
    from benchmarks.scales import SCALES

    keys = sorted({_model_key(r) for name in scales for spec in ABLATIONS.values() if spec.trains
                   for r in spec.runs(SCALES[name])})
    record = {"environment": {**environment("cpu"), "threads": 1}, "scales": list(scales),
              "how": "fastest of 4 AdamW steps after a warm-up, random data, at the run's batch",
              "images_per_s": {key: round(probe_images_per_s(key, "cpu", 1), 1) for key in keys}}
    write_text(THROUGHPUT, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python -m benchmarks.plan --record  (on a quiet machine)")
    print(f"recorded {len(record_throughput()['images_per_s'])} models to {THROUGHPUT}")
