"""What an ablation will cost before it starts: training FLOPs of every run, and minutes on the devices
of the assignment the launchers will use (`benchmarks.assignment`: processes per run, runs at
once), estimated from a short measured throughput probe on the device itself, in the run's precision,
with TF32 and at its micro-batch (or, for GPUs that are not here, from a stated GPU throughput).
`python -m benchmarks all --dry-run` prints it with a live probe. A run's processes are assumed to
scale linearly (data parallelism at a fixed global batch), runs going at once to share nothing.

The budgets are checked by a test against a *recorded* probe (benchmarks/results/plan/throughput.json:
every model of the main and cpu scales, one thread, with the CPU and date it was measured on), so the
check does not depend on how fast or busy the machine running the tests is. Re-record it, on a quiet
machine, when a scale's models change: `python -m benchmarks.plan --record`.

A run's time is its training images at the probed training speed, plus its evaluations (validation
during training, the test set at the end, the few-shot features) at the probed speed of a forward
pass (a third of a training step's work), plus its start. A run that reads image files trains no faster
than its loaders feed it, and starts in a time that grows with its dataset (benchmarks/plan_inputs.py,
from the measured figures of `python -m benchmarks loader`); the plan says which bound each ablation's
runs meet, the device's ("GPU", "CPU") or the loader's.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

import vitzoo
from benchmarks import plan_inputs
from benchmarks.assignment import Assignment
from benchmarks.machine import environment
from benchmarks.spec import Ablation, Scale
from benchmarks.suite import RESULTS, Run, with_threads
from benchmarks.training import dataset_classes, dataset_images, model_options, train_images  # noqa: F401 (planning.dataset_classes: the tests)
from vitzoo.io import write_text

# Two one-thread workers on two cores slow each other (shared memory bandwidth, a lower boost clock):
# the main job took 4.1 min where the single-worker probe predicted 3.5 (2026-11-25, AMD EPYC family 25).
PARALLEL_SLOWDOWN = 1.2
FORWARD_SHARE = 1 / 3  # a forward pass is about a third of a training step's FLOPs
# A GPU that is not here: A100 (bf16, 312 TFLOP/s peak) at the ~40% of peak a ViT reaches in training
STATED_GPU_TFLOPS = 125.0
THROUGHPUT = RESULTS / "plan" / "throughput.json"  # the recorded probe the budget test plans with


@dataclass(frozen=True)
class RunCost:
    train_images: int
    eval_images: int
    flops: float  # training FLOPs (forward and backward)
    longest_eval_images: int = 0  # the images of its longest single evaluation (a SLURM job's warning covers it)


def run_cost(run: Run) -> RunCost:
    """Images trained on and evaluated, and the training FLOPs, from the run's settings alone: its
    training, and the further trainings of the same model its config lists in `more_train` (the
    transfer benchmark's fine-tuning, or its learning-rate sweep)."""
    costs = [training_cost(run, train) for train in (run.config["train"], *run.config.get("more_train", ()))]
    return RunCost(*(sum(getattr(c, f) for c in costs) for f in ("train_images", "eval_images", "flops")),
                   max(c.longest_eval_images for c in costs))


def training_steps(train: dict) -> tuple[int, int]:
    """(optimizer steps, evaluations during training) of one training with the settings `train`."""
    steps = train.get("steps") or max(1, round(train.get("epochs", 10) * (train_images(train) // train["batch_size"])))
    return steps, (steps // train["eval_every"] if train.get("eval_every") else 0)


def training_cost(run: Run, train: dict) -> RunCost:
    """The cost of one training of the run's model with the settings `train`."""
    n_test = dataset_images(train)[1]
    n_test = min(n_test, train.get("test_limit") or n_test)
    batch = train["batch_size"]
    steps, evaluations = training_steps(train)
    eval_each = train.get("val_size") or n_test
    eval_images = evaluations * eval_each + 2 * n_test  # the test set at the end, and its few-shot features
    longest = max(eval_each if evaluations else 0, n_test)
    return RunCost(steps * batch, eval_images, image_flops(_model_key(run)) * steps * batch, longest)


@functools.lru_cache(maxsize=None)
def image_flops(model_key: str) -> float:
    """Training FLOPs of one image (forward and backward), counted once per model: seeds share it."""
    spec = json.loads(model_key)
    return float(vitzoo.count_flops(vitzoo.get_config(spec["model"], **spec["options"]), backward=True))


@functools.lru_cache(maxsize=None)
def input_side(model_key: str) -> int:
    """The side of the model's input images, in pixels."""
    spec = json.loads(model_key)
    return int(vitzoo.get_config(spec["model"], **spec["options"]).img_size[0])


def _model_key(run: Run) -> str:
    train = run.config["train"]  # the images of one forward pass: a micro-batch where accumulation is used
    return json.dumps({"model": run.config["model"], "options": model_options(run),
                       "batch": train.get("micro_batch") or train["batch_size"]}, sort_keys=True)


def run_precision(run: Run, device: str) -> str:
    """The autocast dtype the run trains in on `device` ("float32", "bfloat16", "float16"): its
    --precision, `auto` resolved as training resolves it."""
    from benchmarks.training import train_settings
    from vitzoo import precision

    dtype = precision.training_dtype(train_settings(run.config)["precision"], torch.device(device))
    return precision.NAMES[dtype or torch.float32]


class OutOfMemory(RuntimeError):
    """The probe's micro-batch does not fit on the GPU."""


@functools.lru_cache(maxsize=None)
def probe_images_per_s(model_key: str, device: str, threads: int, precision: str = "float32", steps: int = 4) -> float:
    """Training images per second of one process of this model at its micro-batch: a warm-up step, then
    the fastest of `steps` timed AdamW steps on random data, in the run's precision (autocast) with TF32
    on CUDA, as training runs (the data pipeline is taken to keep up). Raises OutOfMemory on a GPU whose
    memory the micro-batch exceeds."""
    from vitzoo.precision import autocast

    spec = json.loads(model_key)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    where = torch.device(device)
    dtype = None if precision == "float32" else getattr(torch, precision)
    if where.type == "cuda":  # as vitzoo.train does
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    try:
        model = vitzoo.create(spec["model"], **spec["options"]).to(where)
        cfg = model.config
        x = torch.randn(spec["batch"], cfg.in_chans, *cfg.img_size, device=where)
        y = torch.randint(0, cfg.num_classes or 10, (spec["batch"],), device=where)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        sync = (lambda: torch.cuda.synchronize(where)) if where.type == "cuda" else (lambda: None)
        times = []
        for _ in range(steps + 1):  # the first step warms up (allocations, kernel selection)
            sync()
            start = time.perf_counter()
            with autocast(where, dtype):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - start)
        # the fastest step: what the model costs, not what other processes took from it meanwhile
        return spec["batch"] / min(times[1:])
    except torch.OutOfMemoryError:
        name = torch.cuda.get_device_name(where) if where.type == "cuda" else device
        raise OutOfMemory(f"{spec['model']} at micro-batch {spec['batch']} in {precision} does not fit on {name}; "
                          "lower the micro-batch (the run's micro_batch)") from None
    finally:
        model = optimizer = x = None
        if where.type == "cuda":
            torch.cuda.empty_cache()
        torch.set_num_threads(previous)


def device_images_per_s(run: Run, assignment: Assignment, gpu_tflops: float,
                        recorded: Mapping[str, float] | None = None) -> float:
    """Training images per second of one process of the run on its device: the stated GPU throughput
    for GPUs that are not here, else the recorded or a live probe."""
    key = _model_key(run)
    if assignment.device == "cuda" and not assignment.present:
        return gpu_tflops * 1e12 / image_flops(key)
    if recorded is not None:
        if key not in recorded:
            raise KeyError(f"no recorded throughput for the model of run {run.label!r} ({key}); re-record the probe "
                           f"on a quiet machine: python -m benchmarks.plan --record")
        return recorded[key]
    return probe_images_per_s(key, assignment.device, assignment.threads_per_process, run_precision(run, assignment.device))


@dataclass(frozen=True)
class RunTime:
    seconds: float  # wall seconds on the run's share of the assignment, its start included
    bound: str  # what its training images wait for: "GPU" or "CPU" (the device), "loader" (its input pipeline)
    startup_s: float
    longest_eval_s: float = 0.0  # its longest single evaluation (a SLURM job's warning must cover it)


def run_time(run: Run, assignment: Assignment, gpu_tflops: float, recorded: Mapping[str, float] | None = None) -> RunTime:
    """One run on its share of the assignment: each training's images at the lower of its processes'
    summed device throughput and its loaders' rate (benchmarks/plan_inputs.py), its evaluations alike
    at a forward pass's share of the work, and its start."""
    processes = assignment.processes_per_run
    per_process = device_images_per_s(run, assignment, gpu_tflops, recorded)
    img_size = input_side(_model_key(run))
    bound = "GPU" if assignment.device == "cuda" else "CPU"
    start = plan_inputs.BUILD_S + (plan_inputs.RENDEZVOUS_S[assignment.device] if processes > 1 else 0.0)
    seconds = longest_eval = 0.0
    for train in (run.config["train"], *run.config.get("more_train", ())):
        cost = training_cost(run, train)
        training = cost.train_images / (per_process * processes)
        evaluating = FORWARD_SHARE * cost.eval_images / (per_process * processes)
        fed = plan_inputs.feed(train, img_size, processes)
        if fed is not None and fed.serial:  # the training process decodes between its steps
            training, evaluating = training + cost.train_images / fed.train, evaluating + cost.eval_images / fed.evaluation
        elif fed is not None:
            if cost.train_images / fed.train > training:
                bound, training = "loader", cost.train_images / fed.train
            evaluating = max(evaluating, cost.eval_images / fed.evaluation)
        start += plan_inputs.startup_seconds(train, img_size, processes, training_steps(train)[1])
        seconds += training + evaluating
        if cost.eval_images:
            longest_eval = max(longest_eval, evaluating / cost.eval_images * cost.longest_eval_images)
    return RunTime(seconds + start, bound, start, longest_eval)


@dataclass(frozen=True)
class AblationPlan:
    name: str
    runs: int
    to_measure: int
    flops: float
    minutes: float  # wall time of the runs still to measure on the assignment (under SLURM: the longest run)
    budget_min: float | None
    longest_run_min: float = 0.0  # the longest run still to measure (a SLURM job's time limit comes from it)
    device_hours: float = 0.0  # GPU-hours (CPU: process-hours) of the runs still to measure
    problem: str = ""  # what stops a run (a micro-batch that does not fit), instead of an estimate
    longest_eval_min: float = 0.0  # the longest single evaluation of a run still to measure
    bound: str = ""  # what the runs' training waits for: the device ("GPU", "CPU"), "loader", or both, counted
    loader_bound_runs: int = 0  # runs still to measure whose training waits for the loader


def plan_ablation(spec: Ablation, scale: Scale, done: set[str], assignment: Assignment,
                  gpu_tflops: float = STATED_GPU_TFLOPS, recorded: Mapping[str, float] | None = None) -> AblationPlan:
    """The ablation's runs still to measure, their FLOPs and wall time on `assignment` (the one the
    launchers use); `recorded`: images/s per model (see recorded_throughput) instead of a live probe."""
    runs = with_threads(spec.runs(scale), assignment.keyed_threads(spec.trains))
    todo = [r for r in runs if r.key not in done]
    if not spec.trains:  # timings (cost): a few seconds a point, measured one at a time
        return AblationPlan(spec.name, len(runs), len(todo), 0.0, len(todo) * 20 / 60, scale.budget_min)
    flops = sum(run_cost(r).flops for r in runs)
    try:
        times = [run_time(r, assignment, gpu_tflops, recorded) for r in todo]
    except OutOfMemory as exc:
        return AblationPlan(spec.name, len(runs), len(todo), flops, float("nan"), scale.budget_min, problem=str(exc))
    seconds = [t.seconds for t in times]
    at_once = assignment.runs_at_once if spec.parallel else 1
    longest = max(seconds, default=0.0) / 60
    hours = sum(seconds) * assignment.processes_per_run / 3600
    evaluation = max((t.longest_eval_s for t in times), default=0.0) / 60
    loader_bound = sum(t.bound == "loader" for t in times)
    bound = bound_of(loader_bound, len(times), times[0].bound if times else "")
    if at_once is None:  # SLURM: every job may start at once; the longest bounds the wall time
        return AblationPlan(spec.name, len(runs), len(todo), flops, longest, scale.budget_min, longest, hours, bound=bound,
                            loader_bound_runs=loader_bound, longest_eval_min=evaluation)
    slowdown = PARALLEL_SLOWDOWN if at_once > 1 and assignment.device == "cpu" else 1.0
    return AblationPlan(spec.name, len(runs), len(todo), flops, sum(seconds) / at_once * slowdown / 60,
                        scale.budget_min, longest, hours, bound=bound, loader_bound_runs=loader_bound,
                        longest_eval_min=evaluation)


def bound_of(loader_runs: int, runs: int, device: str) -> str:
    """What `runs` wait for, in the plan's words: the device's name, "loader", or "loader (N of M runs)"."""
    if not runs:
        return ""
    if loader_runs == runs:
        return "loader"
    return device if not loader_runs else f"loader ({loader_runs} of {runs} runs)"


def describe(plans: list[AblationPlan], scale: Scale, assignment: Assignment, gpu_tflops: float) -> str:
    from benchmarks.suite import markdown_table

    def within(minutes: float, budget: float | None) -> str:
        return "" if budget is None else ("within" if minutes <= budget else "OVER") + f" {budget:g}"

    unit = "GPU-hours" if assignment.device == "cuda" else "process-hours"
    rows = [[p.name, p.runs, p.to_measure, f"{p.flops:.3g}", "n/a" if p.problem else f"{p.minutes:.1f}",
             f"{p.longest_run_min:.1f}", f"{p.device_hours:.1f}", within(p.minutes, p.budget_min), p.bound] for p in plans]
    total = sum(p.minutes for p in plans if not p.problem)
    if assignment.runs_at_once is None:
        total = max((p.minutes for p in plans if not p.problem), default=0.0)
    rows.append(["all", sum(p.runs for p in plans), sum(p.to_measure for p in plans), f"{sum(p.flops for p in plans):.3g}",
                 f"{total:.1f}", f"{max((p.longest_run_min for p in plans), default=0.0):.1f}",
                 f"{sum(p.device_hours for p in plans):.1f}", within(total, scale.suite_budget_min),
                 bound_of(sum(p.loader_bound_runs for p in plans), sum(p.to_measure for p in plans if p.bound),
                          "GPU" if assignment.device == "cuda" else "CPU")])
    assumed = " (ImageNet-1k's size assumed: no --data given)" if scale.train.get("data") == "imagenet" else ""
    if assignment.device == "cuda" and not assignment.present:
        how = (f"estimated{assumed} from a stated GPU throughput of {gpu_tflops:g} TFLOP/s per GPU in training "
               f"(--gpu-tflops; an A100 in bf16 reaches about {STATED_GPU_TFLOPS:g}), GPUs stated by --gpus")
    else:
        how = f"estimated{assumed} from a measured throughput probe on {assignment.device_name}, in each run's precision"
    problems = "".join(f"\n\n**{p.name} cannot run as planned**: {p.problem}" for p in plans if p.problem)
    if any("loader" in p.bound for p in plans) or scale.train.get("num_workers"):
        how += f"; {plan_inputs.describe_loader()}"
    if scale.suite_budget_min is not None and total > scale.suite_budget_min:
        problems += (f"\n\n**Over budget: {total / 60:.1f} h planned, the scale's budget is {scale.suite_budget_min / 60:g} h"
                     f" on this assignment.**")
    return (f"Plan at `--scale {scale.name}`, {how}; {assignment.describe()}; a run's start: "
            f"{plan_inputs.describe_start()}:\n\n"
            + markdown_table(["ablation", "runs", "to measure", "training FLOPs", "minutes", "longest run (min)", unit,
                              "budget (min)", "bound"], rows) + problems)


def record_throughput(scales: tuple[str, ...] = ("main", "cpu"), threads: int = 1, path: Path = THROUGHPUT) -> dict:
    """Probe every model the given scales train (one thread each, as the two workers of a 2-core
    machine run them) and record images/s with the environment measured on."""
    from benchmarks.ablations import ABLATIONS
    from benchmarks.scales import SCALES

    keys = sorted({_model_key(r) for name in scales for spec in ABLATIONS.values() if spec.trains
                   for r in spec.runs(SCALES[name])})
    record = {"environment": {**environment("cpu"), "threads": threads}, "scales": list(scales),
              "how": "fastest of 4 AdamW steps after a warm-up, random data, at the run's batch",
              "images_per_s": {key: round(probe_images_per_s(key, "cpu", threads), 1) for key in keys}}
    write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def recorded_throughput(path: Path = THROUGHPUT) -> tuple[dict[str, float], dict]:
    """(images/s per model key, the environment they were measured in) from the recorded probe."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; record it on a quiet machine: python -m benchmarks.plan --record")
    record = json.loads(path.read_text())
    return record["images_per_s"], record["environment"]


def build_parser():
    from vitzoo.argvalues import ArgumentParser

    parser = ArgumentParser(prog="python -m benchmarks.plan", description="record the throughput probe the budget test plans with")
    parser.add_argument("--record", action="store_true", required=True, help="measure and record the probe (on a quiet machine)")
    parser.add_argument("--scales", nargs="+", default=["main", "cpu"], help="the scales to probe (default main cpu)")
    return parser


if __name__ == "__main__":
    done = record_throughput(tuple(build_parser().parse_args().scales))
    print(f"recorded {len(done['images_per_s'])} models on {done['environment']['cpu']} to {THROUGHPUT}")
