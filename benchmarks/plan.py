"""What an ablation will cost before it starts: training FLOPs of every run, and minutes on the device
named, estimated from a short measured throughput probe (or, for a GPU that is not here, from a
stated GPU throughput). `python -m benchmarks all --dry-run` prints it with a live probe.

The budgets are checked by a test against a *recorded* probe (benchmarks/results/plan/throughput.json:
every model of the main and cpu scales, one thread, with the CPU and date it was measured on), so the
check does not depend on how fast or busy the machine running the tests is. Re-record it, on a quiet
machine, when a scale's models change: `python -m benchmarks.plan --record`.

A run's time is its training images at the probed training speed, plus its evaluations (validation
during training, the test set at the end, the few-shot features) at the probed speed of a forward
pass (a third of a training step's work), plus a fixed start-up per run.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch

import vitzoo
from benchmarks.spec import Ablation, Scale
from benchmarks.suite import RESULTS, Run, environment
from vitzoo.io import write_text

RUN_OVERHEAD_S = 4.0  # per run: the data loaded from the cache, the model built, the workers fed
# Two one-thread workers on two cores slow each other (shared memory bandwidth, a lower boost clock):
# the main job took 4.1 min where the single-worker probe predicted 3.5 (2026-11-25, AMD EPYC family 25).
PARALLEL_SLOWDOWN = 1.2
FORWARD_SHARE = 1 / 3  # a forward pass is about a third of a training step's FLOPs
# A GPU that is not here: A100 (bf16, 312 TFLOP/s peak) at the ~40% of peak a ViT reaches in training
STATED_GPU_TFLOPS = 125.0
DATASET_IMAGES = {"fashion-mnist": (60_000, 10_000), "cifar10": (50_000, 10_000), "cifar100": (50_000, 10_000),
                  "synthetic": (512, 256)}
IMAGENET = (1_281_167, 50_000)
THROUGHPUT = RESULTS / "plan" / "throughput.json"  # the recorded probe the budget test plans with  # assumed for --scale paper when --data is an ImageFolder not found here


def dataset_images(train: dict) -> tuple[int, int]:
    """(training images, test images) of the run's dataset, before limits."""
    name = train.get("data", "fashion-mnist")
    if name in DATASET_IMAGES:
        return DATASET_IMAGES[name]
    root = Path(name)
    if root.is_dir():
        count = lambda split: sum(len(files) for _, _, files in os.walk(root / split))  # noqa: E731
        return count("train"), count("val") or count("test")
    return IMAGENET


@dataclass(frozen=True)
class RunCost:
    train_images: int
    eval_images: int
    flops: float  # training FLOPs (forward and backward)


def run_cost(run: Run) -> RunCost:
    """Images trained on and evaluated, and the training FLOPs, from the run's settings alone."""
    train = run.config["train"]
    n_train, n_test = dataset_images(train)
    n_train -= train.get("val_size", 0) or 0
    n_train = min(n_train, train.get("train_limit") or n_train)
    n_test = min(n_test, train.get("test_limit") or n_test)
    batch = train["batch_size"]
    steps = train.get("steps") or max(1, round(train.get("epochs", 10) * (n_train // batch)))
    evaluations = steps // train["eval_every"] if train.get("eval_every") else 0
    eval_each = train.get("val_size") or n_test
    eval_images = evaluations * eval_each + 2 * n_test  # the test set at the end, and its few-shot features
    return RunCost(steps * batch, eval_images, image_flops(_model_key(run)) * steps * batch)


@functools.lru_cache(maxsize=None)
def image_flops(model_key: str) -> float:
    """Training FLOPs of one image (forward and backward), counted once per model: seeds share it."""
    spec = json.loads(model_key)
    return float(vitzoo.count_flops(vitzoo.get_config(spec["model"], **spec["options"]), backward=True))


def model_options(run: Run) -> dict:
    """The run's model options with what its dataset decides (10 classes; one channel for Fashion-MNIST)."""
    gray = run.config["train"].get("data", "fashion-mnist") == "fashion-mnist"
    return {**run.config["options"], "num_classes": 10, "in_chans": 1 if gray else 3}


def _model_key(run: Run) -> str:
    train = run.config["train"]  # the images of one forward pass: a micro-batch where accumulation is used
    return json.dumps({"model": run.config["model"], "options": model_options(run),
                       "batch": train.get("micro_batch") or train["batch_size"]}, sort_keys=True)


@functools.lru_cache(maxsize=None)
def probe_images_per_s(model_key: str, device: str, threads: int, steps: int = 4) -> float:
    """Training images per second of this model at its batch size: a warm-up step, then the fastest of
    `steps` timed AdamW steps on random data (the data pipeline is cheap next to the model here)."""
    spec = json.loads(model_key)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = vitzoo.create(spec["model"], **spec["options"]).to(device)
        cfg = model.config
        x = torch.randn(spec["batch"], cfg.in_chans, *cfg.img_size, device=device)
        y = torch.randint(0, 10, (spec["batch"],), device=device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        times = []
        for _ in range(steps + 1):  # the first step warms up (allocations, kernel selection)
            sync()
            start = time.perf_counter()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - start)
        # the fastest step: what the model costs, not what other processes took from it meanwhile
        return spec["batch"] / min(times[1:])
    finally:
        torch.set_num_threads(previous)


def run_seconds(run: Run, cost: RunCost, device: str, threads: int, gpus: int, gpu_tflops: float,
                recorded: Mapping[str, float] | None = None) -> float:
    if device.startswith("cuda") and not torch.cuda.is_available():  # a GPU that is not here: stated speed
        return cost.flops * (1 + FORWARD_SHARE * cost.eval_images / max(cost.train_images, 1)) / (gpus * gpu_tflops * 1e12)
    key = _model_key(run)
    if recorded is not None:
        if key not in recorded:
            raise KeyError(f"no recorded throughput for the model of run {run.label!r} ({key}); re-record the probe "
                           f"on a quiet machine: python -m benchmarks.plan --record")
        ips = recorded[key]
    else:
        ips = probe_images_per_s(key, "cpu" if device == "auto" else device, threads)
    return RUN_OVERHEAD_S + cost.train_images / ips + FORWARD_SHARE * cost.eval_images / ips


@dataclass(frozen=True)
class AblationPlan:
    name: str
    runs: int
    to_measure: int
    flops: float
    minutes: float  # wall time of the runs still to measure, with the workers given
    budget_min: float | None


def plan_ablation(spec: Ablation, scale: Scale, done: set[str], device: str, workers: int,
                  gpus: int = 8, gpu_tflops: float = STATED_GPU_TFLOPS,
                  recorded: Mapping[str, float] | None = None) -> AblationPlan:
    """The ablation's runs still to measure, their FLOPs and wall time; `recorded`: images/s per model
    (see recorded_throughput) instead of a live probe."""
    runs = spec.runs(scale)
    todo = [r for r in runs if r.key not in done]
    if not spec.trains:  # timings (cost): a few seconds a point, measured one at a time
        return AblationPlan(spec.name, len(runs), len(todo), 0.0, len(todo) * 20 / 60, scale.budget_min)
    workers = workers if spec.parallel else 1
    threads = max(1, torch.get_num_threads() // workers)
    costs = {r.key: run_cost(r) for r in runs}
    seconds = sum(run_seconds(r, costs[r.key], device, threads, gpus, gpu_tflops, recorded) for r in todo)
    parallel = 1 if device.startswith("cuda") else workers  # on GPUs the runs share the GPUs in turn
    slowdown = PARALLEL_SLOWDOWN if parallel > 1 else 1.0
    return AblationPlan(spec.name, len(runs), len(todo), sum(c.flops for c in costs.values()),
                        seconds / parallel * slowdown / 60, scale.budget_min)


def describe(plans: list[AblationPlan], scale: Scale, device: str, workers: int, gpus: int, gpu_tflops: float) -> str:
    from benchmarks.suite import markdown_table

    rows = [[p.name, p.runs, p.to_measure, f"{p.flops:.3g}", f"{p.minutes:.1f}",
             "" if p.budget_min is None else ("within" if p.minutes <= p.budget_min else "OVER") + f" {p.budget_min:g}"]
            for p in plans]
    total = sum(p.minutes for p in plans)
    rows.append(["all", sum(p.runs for p in plans), sum(p.to_measure for p in plans), f"{sum(p.flops for p in plans):.3g}",
                 f"{total:.1f}", "" if scale.suite_budget_min is None else
                 ("within" if total <= scale.suite_budget_min else "OVER") + f" {scale.suite_budget_min:g}"])
    assumed = " (ImageNet-1k's size assumed: no --data given)" if scale.train.get("data") == "imagenet" else ""
    if device.startswith("cuda") and not torch.cuda.is_available():
        how = (f"estimated{assumed} from a stated GPU throughput: {gpus} GPUs at {gpu_tflops:g} TFLOP/s each in training "
               f"(--gpus, --gpu-tflops; an A100 in bf16 reaches about {STATED_GPU_TFLOPS:g})")
    else:
        how = (f"estimated{assumed} from a measured throughput probe on `{device}` ({workers} worker(s), "
               f"{max(1, torch.get_num_threads() // workers)} thread(s) each)")
    return (f"Plan at `--scale {scale.name}`, {how}:\n\n"
            + markdown_table(["ablation", "runs", "to measure", "training FLOPs", "minutes", "budget (min)"], rows))


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


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.plan",
                                     description="record the throughput probe the budget test plans with")
    parser.add_argument("--record", action="store_true", required=True)
    parser.add_argument("--scales", nargs="+", default=["main", "cpu"])
    done = record_throughput(tuple(parser.parse_args().scales))
    print(f"recorded {len(done['images_per_s'])} models on {done['environment']['cpu']} to {THROUGHPUT}")
