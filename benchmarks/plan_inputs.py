"""What the input pipeline costs a run in the plan (benchmarks/plan.py): how fast its loader feeds a run
that reads image files, and what its start costs.

The loader's rate is the recorded rate of one worker (benchmarks/results/loader/, `python -m benchmarks
loader`: one process of one thread, at the scale's input size, augmentation and micro-batch) times the
run's `num_workers` times its processes; a run trains at the lower of it and its device's rate, and the
plan says which bound applies. Workers decode in this estimate (the `torchvision.io` path): with
`--decode device` (the default on CUDA) the GPU decodes, at a rate gpu-check's `loader` step measures and
the plan does not assume. Without workers (`num_workers` 0) the training process decodes between its
steps: the two times add up.

A run's start: building it (stated, `BUILD_S`: what the plan assumed for every run before), plus for a
run of image files every rank listing the folder (at the measured files/s, warm in the page cache), its
training loader's workers started, each evaluation pass's workers started (its loader ends them after the
pass) and the first micro-batch; plus, for a run of several processes, their rendezvous (stated,
`RENDEZVOUS_S`) and, on Python < 3.12, each rank's fork server (measured), from which the workers start
with the dataset pickled to each one (measured per million files).
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.suite import RESULTS
from benchmarks.training import DATASET_IMAGES, dataset_images

LOADER = RESULTS / "loader" / "results.json"
BUILD_S = 4.0  # stated, every run: the data's index read, the model built and moved, the optimizer made
# stated, a run of several processes: the elastic launcher starting them (each imports torch and vitzoo),
# the rendezvous, the process group's communicators (NCCL's on GPUs) and the first collectives
RENDEZVOUS_S = {"cuda": 30.0, "cpu": 5.0}
DECODED_BY_PIL = ("oxford-pets", "flowers102")  # torchvision's datasets of files: PIL decodes in the workers


@functools.lru_cache(maxsize=4)
def recorded_loader(path: Path = LOADER) -> dict[str, Any]:
    """The committed loader measurement (per-worker rates, listing, workers' start)."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; measure it on a quiet machine: python -m benchmarks loader")
    return json.loads(path.read_text())


def file_source(train: dict) -> tuple[str, str] | None:
    """(which files, which decoding path) of a training that reads image files, or None (tensors in memory):
    the rehearsal's own small JPEGs, or ImageNet-sized ones (an ImageFolder, ImageNet assumed, Pets, Flowers)."""
    name = train.get("data", "fashion-mnist")
    if name in DECODED_BY_PIL:
        return "imagenet-like", "pil"
    if name in DATASET_IMAGES:
        return None
    from benchmarks.rehearsal_data import is_rehearsal_folder

    return ("rehearsal" if is_rehearsal_folder(name) else "imagenet-like"), "torchvision.io"


def worker_rate(record: dict, source: str, img_size: int, path: str) -> float:
    """Images/s of one worker on `path` at `img_size`: the recorded figure, or between (or beyond) the
    recorded sizes of those files with a time per image of a + b x pixels (decoding, then the resize's work)."""
    points = [(p["img_size"], p["images_per_s"][path]) for p in record["pipelines"]
              if (p["scale"] == "rehearsal") == (source == "rehearsal")]
    exact = [rate for size, rate in points if size == img_size]
    if exact or len(points) == 1:
        return (exact or [points[0][1]])[0]
    (s0, r0), (s1, r1) = sorted(points)[:2]
    slope = (1 / r1 - 1 / r0) / (s1**2 - s0**2)
    return 1 / max(1 / r0 + slope * (img_size**2 - s0**2), 1e-9)


@dataclass(frozen=True)
class Feed:
    """How fast a run's loaders feed it (images/s of all its processes), and whether the training
    process decodes itself (no workers: its time adds to the training's)."""

    train: float
    evaluation: float
    serial: bool


def feed(train: dict, img_size: int, processes: int) -> Feed | None:
    """The loaders' rates of a training that reads image files, None for one that does not."""
    source = file_source(train)
    if source is None:
        return None
    record = recorded_loader()
    workers = train.get("num_workers", 0)
    each = max(workers, 1) * processes
    return Feed(worker_rate(record, source[0], img_size, source[1]) * each,
                worker_rate(record, source[0], img_size, "evaluation") * each, workers == 0)


def evaluation_passes(train: dict, evaluations: int) -> list[int]:
    """The files behind each evaluation pass of a training that evaluates `evaluations` times while it
    trains (what each pass's workers are given): the whole training split's for the validation passes and
    the few-shot training features (a validation split is a subset of it), the test split's for the
    test and its few-shot features."""
    n_train, n_test = dataset_images(train)
    validation = n_train if train.get("val_size") else n_test
    return [validation] * evaluations + ([n_train] if train.get("val_size") else []) + [n_test, n_train, n_test]


def startup_seconds(train: dict, img_size: int, processes: int, evaluations: int) -> float:
    """The start of one training of a run (not `BUILD_S` nor the rendezvous: once a run) that grows with
    its dataset: listing, the loaders' workers started, the first micro-batch. 0 for one of tensors."""
    source = file_source(train)
    if source is None:
        return 0.0
    record = recorded_loader()
    n_train, n_test = dataset_images(train)
    seconds = (n_train + n_test) / record["listing"]["files_per_s"]
    workers = train.get("num_workers", 0)
    if not workers:
        return seconds
    server = processes > 1 and sys.version_info < (3, 12)  # vitzoo.data.workers: a rank's workers' start
    start = record["worker_start"]["forkserver" if server else "fork"]

    def started(files: int) -> float:
        return start["fixed_s"] + workers * (start["per_worker_s"] + start["per_worker_per_million_files_s"] * files / 1e6)

    seconds += started(n_train) + sum(started(files) for files in evaluation_passes(train, evaluations))
    seconds += record["worker_start"]["fork_server_first_loader_s"] if server else 0.0
    micro = train.get("micro_batch") or train["batch_size"] // processes
    return seconds + micro / worker_rate(record, source[0], img_size, source[1])  # one worker's first micro-batch


def describe_start() -> str:
    """What a run's start is made of, for the plan's text."""
    return (f"{BUILD_S:g} s to build it (stated), {RENDEZVOUS_S['cuda']:g} s on GPUs ({RENDEZVOUS_S['cpu']:g} s on the CPU) "
            "for several processes to meet (stated), and for image files the measured listing, workers' starts and "
            "first micro-batch at the dataset's size")


def describe_loader() -> str:
    """Where the loader's figures come from, for the plan's text."""
    env = recorded_loader()["environment"]
    return (f"loaders at the recorded rate of one worker (benchmarks/results/loader/: {env['cpu']}, {env['date'][:10]}, "
            f"libjpeg-turbo decoding in the workers) x num_workers x processes; `--decode device` (the default on CUDA) "
            f"decodes on the GPU instead, at a rate the plan does not assume (gpu-check's `loader` step measures it)")


__all__ = ["BUILD_S", "RENDEZVOUS_S", "Feed", "describe_loader", "describe_start", "evaluation_passes", "feed", "file_source",
           "recorded_loader", "startup_seconds", "worker_rate"]
