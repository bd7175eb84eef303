"""Training runs of the ablations: how a run is measured (its scales: benchmarks/scales.py).

A run's `config` holds every option: `model` (a zoo name), `options` (ViTConfig fields, the core
issue's names) and `train` (TrainConfig fields). Measuring trains it with a `vitzoo.train.Trainer`,
then reads test accuracy, the paper's 5-shot linear accuracy, the accuracy after each epoch, and the
training compute in FLOPs (one image's forward and backward pass counted with torch.utils.flop_counter,
times the images seen).
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


def training_flops(model: vitzoo.VisionTransformer, images_seen: int) -> float:
    """FLOPs of training on `images_seen` images: one image's forward and backward pass, counted by
    `vitzoo.count_flops`, times the images seen. The optimizer's element-wise update is not counted."""
    return float(vitzoo.count_flops(model.config, backward=True)) * images_seen


class Interrupted(RuntimeError):
    """The run stopped before its end (a signal: Ctrl-C, SIGTERM, SLURM's USR2), its checkpoint written;
    measuring it again resumes from there."""


# A benchmark computes in a fixed precision, never one measured on the machine (`--precision auto` on the
# CPU): the GPU's native half precision, float32 on the CPU, unless the scale says otherwise.
PRECISION = "gpu-half"


def train_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The TrainConfig settings of a run's config: the scale's, over the benchmarks' fixed precision and a
    checkpoint at the end only (the scale's cadence where it has one)."""
    return {"checkpoint_every": 0, "precision": PRECISION, **config["train"]}


def measure(run: Run, device: str, out: Path) -> dict[str, Any]:
    return train(run, device, out)[1]


def train(run: Run, device: str, out: Path) -> tuple[vitzoo.VisionTransformer, dict[str, Any]]:
    """Train the run's model in its folder `out` (the suite's: RESULTS/<ablation>/runs/<key>-n<version>/,
    `benchmarks.suite.run_folder`) and return it with the measured outcome, on every process of the run.

    The training run lives in OUT/train/: its settings, checkpoints, metrics, final weights and summary,
    on the results' disk (a temporary folder could lose a run of hours at its very end). A folder that
    holds an unfinished run of the same settings is resumed from its last checkpoint; one that holds a
    finished run is read, not trained again (its checkpoints are removed once it has finished: the final
    weights stay). A run stopped by a signal raises `Interrupted`.
    """
    config = run.config
    folder = Path(out) / "train"
    summary_path = folder / "summary.json"
    finished = summary_path.exists() and json.loads(summary_path.read_text()).get("status") == "finished"
    if finished:
        model = vitzoo.from_pretrained(folder)
        summary = json.loads(summary_path.read_text())
    else:
        # a progress bar for the run when the suite runs in one process in a terminal (several workers'
        # bars would overwrite each other)
        quiet = multiprocessing.parent_process() is not None or not sys.stderr.isatty()
        settings = train_settings(config)
        train = TrainConfig(model=config["model"], model_options=dict(config["options"]), seed=run.seed,
                            device=device, quiet=quiet, tensorboard=False, fewshot=(5,), out=str(folder),
                            resume=(folder / "train_config.json").exists(), **settings)
        trainer = Trainer.from_config(train)
        if trainer.resume_from is not None and trainer.env.is_main:  # said in the run's log, quiet or not
            print(f"resuming run {run.label!r} seed {run.seed} at step {trainer.step} from {trainer.resume_from}",
                  file=sys.stderr, flush=True)
        summary = trainer.run()
        if summary["status"] != "finished":
            raise Interrupted(f"run {run.label!r} seed {run.seed} stopped at step {summary['step']} "
                              f"({summary['status']}); its checkpoint is in {folder}, and it resumes from there")
        model = trainer.model
        if trainer.env.is_main:  # a finished run is read back from its summary and final weights, never resumed
            shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    return model, outcome(model, summary, folder)


def outcome(model: vitzoo.VisionTransformer, summary: dict[str, Any], folder: Path) -> dict[str, Any]:
    """What the suite records of a finished training run: accuracies, curves, compute, size."""
    history = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps_per_epoch = summary["step"] / summary["epochs"] if summary["epochs"] else 1.0
    # accuracy during training: on the test set, or on the validation split when the run holds one out
    curve = [{"epoch": h["step"] / steps_per_epoch, "test_acc": h["eval_top1"]} for h in history if "eval_top1" in h]
    val_curve = [{"epoch": h["step"] / steps_per_epoch, "val_acc": h["val_top1"]} for h in history if "val_top1" in h]
    best = {"best_step": summary["best_step"], "val_acc": summary["best_val_top1"]} if "best_step" in summary else {}
    return {
        "metrics": {"test_acc": summary["test_top1"], "fewshot_5": summary["fewshot"].get("5"), "curve": curve,
                    "final_loss": summary["final_loss"], "images_per_s": summary["images_per_s"],
                    **({"val_curve": val_curve} if val_curve else {}), **best},
        "flops": training_flops(model, summary["images_seen"]),
        "params": summary["params"],
        "model_config": summary["model_config"],
        "world_size": summary["world_size"],
    }


# Images of the named datasets' (training, test) splits; an ImageFolder's are counted, shards' read from
# their info file (or index), and a dataset that is none of these (a dry run of the paper's scale without
# --data) is taken to be ImageNet-1k.
DATASET_IMAGES = {"fashion-mnist": (60_000, 10_000), "cifar10": (50_000, 10_000), "cifar100": (50_000, 10_000),
                  "oxford-pets": (3_680, 3_669), "flowers102": (2_040, 6_149), "synthetic": (10_000, 2_000)}
IMAGENET = (1_281_167, 50_000)


@functools.lru_cache(maxsize=None)
def _folder_images(root: str) -> tuple[int, int]:
    count = lambda split: sum(len(files) for _, _, files in os.walk(Path(root) / split))  # noqa: E731
    return count("train"), count("val") or count("test")


def dataset_images(train: dict) -> tuple[int, int]:
    """(training images, test images) of the run's dataset, before limits and the validation split."""
    name = train.get("data", "fashion-mnist")
    if name in DATASET_IMAGES:
        return DATASET_IMAGES[name]
    if shards.is_shards(name):
        try:
            return shards.split_sizes(name)
        except DataError:  # shards not on this machine (a dry run): ImageNet-1k, as for a folder not here
            return IMAGENET
    spec = planned(name)  # the rehearsal's folder, which a dry run plans without writing it
    if spec is not None:
        return spec.train_images, spec.val_images
    if Path(name).is_dir():
        return _folder_images(str(Path(name).resolve()))
    return IMAGENET


def dataset_classes(train: dict) -> int:
    """Classes of the run's dataset (an ImageFolder's: its class folders; ImageNet's 1000 when assumed)."""
    name = train.get("data", "fashion-mnist")
    if name in ("cifar100", "oxford-pets", "flowers102"):
        return {"cifar100": 100, "oxford-pets": 37, "flowers102": 102}[name]
    if name in ("fashion-mnist", "cifar10", "synthetic"):
        return 10
    spec = planned(name)  # the rehearsal's folder, which a dry run plans without writing it
    if spec is not None:
        return spec.classes
    root = Path(name) / "train"
    return sum(1 for p in root.iterdir() if p.is_dir()) if root.is_dir() else 1000


def model_options(run: Run) -> dict:
    """The run's model options with what its dataset decides (its classes; one channel for Fashion-MNIST)."""
    train = run.config["train"]
    gray = train.get("data", "fashion-mnist") == "fashion-mnist"
    return {**run.config["options"], "num_classes": dataset_classes(train), "in_chans": 1 if gray else 3}


def train_images(train: dict) -> int:
    """The images a run trains on: its dataset's training split less the validation split, cut to its limit."""
    images = dataset_images(train)[0] - (train.get("val_size") or 0)
    return min(images, train.get("train_limit") or images)


def evaluate_per_epoch(train: dict, per_epoch: int = 1) -> dict:
    """Evaluate `per_epoch` times an epoch (for accuracy-vs-epoch curves), an epoch being the images the
    run trains on (its dataset's, not a fixed count)."""
    return {**train, "eval_every": max(1, train_images(train) // train["batch_size"] // per_epoch)}
