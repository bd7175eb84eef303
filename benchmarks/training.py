"""Training runs of the ablations: how a run is measured (its scales: benchmarks/scales.py).

A run's `config` holds every option: `model` (a zoo name), `options` (ViTConfig fields, the core
issue's names) and `train` (TrainConfig fields). Measuring trains it with a `vitzoo.train.Trainer`,
then reads test accuracy, the paper's 5-shot linear accuracy, the accuracy after each epoch, and the
training compute in FLOPs (one image's forward and backward pass counted with torch.utils.flop_counter,
times the images seen).
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import tempfile
from pathlib import Path
from typing import Any

import vitzoo
from benchmarks.suite import Run
from vitzoo.train import TrainConfig, Trainer


def training_flops(model: vitzoo.VisionTransformer, images_seen: int) -> float:
    """FLOPs of training on `images_seen` images: one image's forward and backward pass, counted by
    `vitzoo.count_flops`, times the images seen. The optimizer's element-wise update is not counted."""
    return float(vitzoo.count_flops(model.config, backward=True)) * images_seen


def measure(run: Run, device: str) -> dict[str, Any]:
    return train(run, device)[1]


def train(run: Run, device: str) -> tuple[vitzoo.VisionTransformer, dict[str, Any]]:
    """Train the run's model; return it and the measured outcome."""
    config = run.config
    with tempfile.TemporaryDirectory() as out:
        # a progress bar for the run when the suite runs in one process in a terminal (several workers'
        # bars would overwrite each other)
        quiet = multiprocessing.parent_process() is not None or not sys.stderr.isatty()
        train = TrainConfig(model=config["model"], model_options=dict(config["options"]), seed=run.seed,
                            device=device, quiet=quiet, tensorboard=False, fewshot=(5,), out=out,
                            checkpoint_every=0, **config["train"])
        trainer = Trainer.from_config(train)
        summary = trainer.run()
        model = trainer.model
        history = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    steps_per_epoch = summary["step"] / summary["epochs"] if summary["epochs"] else 1.0
    # accuracy during training: on the test set, or on the validation split when the run holds one out
    curve = [{"epoch": h["step"] / steps_per_epoch, "test_acc": h["eval_top1"]} for h in history if "eval_top1" in h]
    val_curve = [{"epoch": h["step"] / steps_per_epoch, "val_acc": h["val_top1"]} for h in history if "val_top1" in h]
    best = {"best_step": summary["best_step"], "val_acc": summary["best_val_top1"]} if "best_step" in summary else {}
    return model, {
        "metrics": {"test_acc": summary["test_top1"], "fewshot_5": summary["fewshot"].get("5"), "curve": curve,
                    "final_loss": summary["final_loss"], "images_per_s": summary["images_per_s"],
                    **({"val_curve": val_curve} if val_curve else {}), **best},
        "flops": training_flops(model, summary["images_seen"]),
        "params": summary["params"],
        "model_config": summary["model_config"],
    }


def evaluate_per_epoch(train: dict, per_epoch: int = 1) -> dict:
    """Evaluate `per_epoch` times an epoch (for accuracy-vs-epoch curves)."""
    batch = train["batch_size"]
    images = train.get("train_limit") or 60_000
    return {**train, "eval_every": max(1, images // batch // per_epoch)}
