"""What an ablation will cost before it starts, as `--dry-run` prints it: the training FLOPs of
its runs, and their minutes on the assignment at a stated throughput, `--gpu-tflops` a GPU or
CPU_GFLOPS a CPU thread. A run's evaluations cost a third of its training an image, and a run
starts in a stated time. The plan says whether the runs fit the scale's budget.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from benchmarks.runner import Assignment
from benchmarks.spec import Ablation, Scale
from benchmarks.suite import Run, markdown_table
from benchmarks.training import dataset_images, image_flops, train_images

FORWARD_SHARE = 1 / 3  # a forward pass: about a third of a training step's FLOPs
STATED_GPU_TFLOPS = 125.0  # an A100 in bf16 at ~40% of its peak, as a ViT trains
# float32 training of the cpu scale's models on one thread of a 2-core AMD EPYC beside another
# worker: 22-53 GFLOP/s measured, the base ViT's 36
CPU_GFLOPS = 36.0
BUILD_S = 4.0  # stated: the data's index read, the model built, the optimizer made
RENDEZVOUS_S = {"cuda": 30.0, "cpu": 5.0}  # stated: a run's processes started and met


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
    return image_flops(run) * sum(work(train)[0] for train in trainings(run))


def run_seconds(run: Run, assignment: Assignment, gpu_tflops: float) -> float:
    """The run's wall time on its share of the assignment."""
    processes = assignment.processes_per_run
    per_process = (gpu_tflops * 1e12 if assignment.device == "cuda"
                   else CPU_GFLOPS * 1e9 * assignment.threads_per_process)
    images = sum(trained + FORWARD_SHARE * evaluated
                 for trained, evaluated in map(work, trainings(run)))
    start = BUILD_S + (RENDEZVOUS_S[assignment.device] if processes > 1 else 0.0)
    return start + images * image_flops(run) / (per_process * processes)


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


def plan_ablation(spec: Ablation, scale: Scale, done: set[str], assignment: Assignment,
                  gpu_tflops: float = STATED_GPU_TFLOPS) -> AblationPlan:
    """The ablation's runs still to measure, their FLOPs and time on `assignment`."""
    threads = assignment.keyed_threads(spec.trains)
    runs = [dataclasses.replace(r, threads=threads) for r in spec.runs(scale)]
    todo = [r for r in runs if r.key not in done]
    if not spec.trains:  # timings: a few seconds a point, one at a time
        return AblationPlan(spec.name, len(runs), len(todo), 0.0, len(todo) / 3, scale.budget_min)
    seconds = [run_seconds(r, assignment, gpu_tflops) for r in todo]
    minutes = longest = max(seconds, default=0.0) / 60
    if assignment.launcher == "local":  # under SLURM the longest run bounds the time
        minutes = sum(seconds) / (len(assignment.slots) if spec.parallel else 1) / 60
    return AblationPlan(spec.name, len(runs), len(todo), sum(map(training_flops, runs)), minutes,
                        scale.budget_min, longest,
                        sum(seconds) * assignment.processes_per_run / 3600)


def describe(plans: list[AblationPlan], scale: Scale, assignment: Assignment,
             gpu_tflops: float) -> str:
    def within(minutes: float, budget: float | None) -> str:
        return "" if budget is None else f"{'within' if minutes <= budget else 'OVER'} {budget:g}"

    minutes = [p.minutes for p in plans]
    total = sum(minutes) if assignment.launcher == "local" else max(minutes, default=0.0)
    rows = [[p.name, p.runs, p.to_measure, f"{p.flops:.3g}", f"{p.minutes:.1f}",
             f"{p.longest_run_min:.1f}", f"{p.device_hours:.1f}", within(p.minutes, p.budget_min)]
            for p in plans]
    longest = max((p.longest_run_min for p in plans), default=0.0)
    rows.append(["all", sum(p.runs for p in plans), sum(p.to_measure for p in plans),
                 f"{sum(p.flops for p in plans):.3g}", f"{total:.1f}", f"{longest:.1f}",
                 f"{sum(p.device_hours for p in plans):.1f}",
                 within(total, scale.suite_budget_min)])
    gpus = assignment.device == "cuda"
    how = (f"{gpu_tflops:g} TFLOP/s per GPU (--gpu-tflops)" if gpus else
           f"{CPU_GFLOPS:g} GFLOP/s per CPU thread")
    assumed = ", ImageNet-1k's size assumed" if scale.train.get("data") == "imagenet" else ""
    text = (f"Plan at `--scale {scale.name}`, at a stated {how}{assumed}; "
            f"{assignment.describe()}; a run starts in {BUILD_S:g} s, +{RENDEZVOUS_S['cuda']:g} s "
            f"on GPUs (+{RENDEZVOUS_S['cpu']:g} s on the CPU) for several processes:\n\n"
            + markdown_table(["ablation", "runs", "to measure", "training FLOPs", "minutes",
                              "longest run (min)", "GPU-hours" if gpus else "process-hours",
                              "budget (min)"], rows))
    if scale.suite_budget_min is not None and total > scale.suite_budget_min:
        text += (f"\n\n**Over budget: {total / 60:.1f} h planned, the scale's budget is "
                 f"{scale.suite_budget_min / 60:g} h on this assignment.**")
    return text
