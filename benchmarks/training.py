"""How a training run of an ablation is measured, and the sizes of its data. A run's config holds
`model` (a zoo name), `options` (ViTConfig fields) and `train` (TrainConfig fields); measuring
trains it with `vitzoo.train.Trainer` in the run's folder and reads its test accuracy, the paper's
5-shot linear accuracy, the accuracy during training and the training FLOPs.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import vitzoo
from benchmarks.rehearsal_data import planned
from benchmarks.suite import Run
from vitzoo.data import shards
from vitzoo.errors import DataError
from vitzoo.train import TrainConfig, Trainer

# a benchmark computes in a fixed precision, never one measured on the machine: the GPU's native
# half precision, float32 on the CPU
PRECISION = "gpu-half"


class Interrupted(RuntimeError):
    """The run stopped before its end (a signal), its checkpoint written; it resumes from there."""


def train_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The run's TrainConfig settings: the scale's, over a fixed precision and one checkpoint."""
    return {"checkpoint_every": 0, "precision": PRECISION, **config["train"]}


def measure(run: Run, device: str, out: Path) -> dict[str, Any]:
    return train(run, device, out)[1]


def train(run: Run, device: str, out: Path) -> tuple[vitzoo.VisionTransformer, dict[str, Any]]:
    """Train the run in OUT/train and return the model and its outcome, on every process of the
    run. An unfinished run there resumes from its last checkpoint; a finished one is read back.
    A run stopped by a signal raises Interrupted."""
    folder = Path(out) / "train"
    summary = folder / "summary.json"
    if summary.exists() and json.loads(summary.read_text()).get("status") == "finished":
        return _outcome(vitzoo.from_pretrained(folder), json.loads(summary.read_text()), folder)
    # a progress bar only for a run alone in a terminal: several would overwrite each other
    quiet = multiprocessing.parent_process() is not None or not sys.stderr.isatty()
    config = TrainConfig(model=run.config["model"], model_options=dict(run.config["options"]),
                         seed=run.seed, device=device, quiet=quiet, tensorboard=False,
                         fewshot=(5,), out=str(folder),
                         resume=(folder / "train_config.json").exists(),
                         **train_settings(run.config))
    trainer = Trainer.from_config(config)
    if trainer.resume_from is not None and trainer.env.is_main:
        print(f"resuming run {run.label!r} seed {run.seed} at step {trainer.step} from "
              f"{trainer.resume_from}", file=sys.stderr, flush=True)
    summary = trainer.run()
    if summary["status"] != "finished":
        raise Interrupted(f"run {run.label!r} seed {run.seed} stopped at step {summary['step']} "
                          f"({summary['status']}); it resumes from its checkpoint in {folder}")
    if trainer.env.is_main:  # the final weights stay
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    return trainer.model, _outcome(trainer.model, summary, folder)


def _outcome(model: vitzoo.VisionTransformer, summary: dict, folder: Path) -> dict[str, Any]:
    history = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    per_epoch = summary["step"] / summary["epochs"] if summary["epochs"] else 1.0
    curve = [{"epoch": h["step"] / per_epoch, "test_acc": h["eval_top1"]}
             for h in history if "eval_top1" in h]
    val_curve = [{"epoch": h["step"] / per_epoch, "val_acc": h["val_top1"]}
                 for h in history if "val_top1" in h]
    best = ({"best_step": summary["best_step"], "val_acc": summary["best_val_top1"]}
            if "best_step" in summary else {})
    metrics = {"test_acc": summary["test_top1"], "fewshot_5": summary["fewshot"].get("5"),
               "curve": curve, "final_loss": summary["final_loss"],
               "images_per_s": summary["images_per_s"],
               **({"val_curve": val_curve} if val_curve else {}), **best}
    # one image's forward and backward pass, times the images seen (not the optimizer's update)
    flops = float(vitzoo.count_flops(model.config, backward=True)) * summary["images_seen"]
    return {"metrics": metrics, "flops": flops, "params": summary["params"],
            "model_config": summary["model_config"], "world_size": summary["world_size"]}


# (training, test) images of the named datasets; a folder not here is taken to be ImageNet-1k
DATASET_IMAGES = {"fashion-mnist": (60_000, 10_000), "cifar10": (50_000, 10_000),
                  "cifar100": (50_000, 10_000), "oxford-pets": (3_680, 3_669),
                  "flowers102": (2_040, 6_149), "synthetic": (10_000, 2_000)}
CLASSES = {"cifar100": 100, "oxford-pets": 37, "flowers102": 102}
IMAGENET = (1_281_167, 50_000)


@functools.lru_cache(maxsize=None)
def _folder_images(root: str) -> tuple[int, int]:
    def count(split: str) -> int:
        return sum(len(files) for _, _, files in os.walk(Path(root) / split))

    return count("train"), count("val") or count("test")


def dataset_images(train: dict) -> tuple[int, int]:
    """(training, test) images of the run's dataset, before limits and the validation split."""
    name = train.get("data", "fashion-mnist")
    if name in DATASET_IMAGES:
        return DATASET_IMAGES[name]
    if shards.is_shards(name):
        try:
            return shards.split_sizes(name)
        except DataError:  # not on this machine
            return IMAGENET
    if (spec := planned(name)) is not None:  # the rehearsal's folder, planned by a dry run
        return spec.train_images, spec.val_images
    return _folder_images(str(Path(name).resolve())) if Path(name).is_dir() else IMAGENET


def dataset_classes(train: dict) -> int:
    name = train.get("data", "fashion-mnist")
    if name in DATASET_IMAGES:
        return CLASSES.get(name, 10)
    if (spec := planned(name)) is not None:
        return spec.classes
    root = Path(name) / "train"
    return sum(1 for p in root.iterdir() if p.is_dir()) if root.is_dir() else 1000


def model_options(run: Run) -> dict:
    """The run's model options with what its dataset decides: classes, channels."""
    train = run.config["train"]
    gray = train.get("data", "fashion-mnist") == "fashion-mnist"
    return {**run.config["options"], "num_classes": dataset_classes(train),
            "in_chans": 1 if gray else 3}


def image_flops(run: Run) -> float:
    """Training FLOPs (forward and backward) of one image in the run's model."""
    return _flops(run.config["model"], json.dumps(model_options(run), sort_keys=True))


@functools.lru_cache(maxsize=None)
def _flops(model: str, options: str) -> float:
    return float(vitzoo.count_flops(vitzoo.get_config(model, **json.loads(options)), backward=True))


def train_images(train: dict) -> int:
    """The images a run trains on: the training split less the validation split, to its limit."""
    images = dataset_images(train)[0] - (train.get("val_size") or 0)
    return min(images, train.get("train_limit") or images)


def evaluate_per_epoch(train: dict, per_epoch: int = 1) -> dict:
    """Evaluate `per_epoch` times an epoch of the images the run trains on (accuracy curves)."""
    return {**train, "eval_every": max(1, train_images(train) // train["batch_size"] // per_epoch)}
