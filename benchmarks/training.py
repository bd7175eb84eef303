"""Training runs of the ablations: what a run is at each scale, and how it is measured.

A run's `config` holds every option: `model` (a zoo name), `options` (ViTConfig fields, the core
issue's names) and `train` (TrainConfig fields). Measuring trains it with `vitzoo.train.fit_model`,
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
from vitzoo.train import TrainConfig, fit_model

# The CPU scale: real Fashion-MNIST at 28 px, small ViTs, one epoch (Table 8 et al. at 1/1000 size),
# sized so that `all --workers 2` finishes within 90 minutes on 2 cores. The ablations whose models
# cost up to 5x the base (hybrid, shape) train on half the training set (CPU_COSTLY_TRAIN_LIMIT).
CPU_MODEL = dict(img_size=28, patch_size=4, embed_dim=64, depth=4, num_heads=4, mlp_dim=128)
CPU_TRAIN = dict(data="fashion-mnist", recipe="paper-pretrain", epochs=1.0, batch_size=128, lr=1e-3,
                 weight_decay=0.1, warmup=0.1, clip_grad=1.0)
CPU_COSTLY_TRAIN_LIMIT = 30_000
# --quick: the same code path on a sliver of the data, for tests (seconds per run).
QUICK_MODEL = dict(img_size=28, patch_size=7, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
QUICK_TRAIN = dict(data="fashion-mnist", recipe="paper-pretrain", epochs=1.0, batch_size=64, lr=1e-3,
                   train_limit=512, test_limit=256, warmup=0.1)
# The paper's scale (GPUs; `--data` an ImageFolder or CIFAR path): ViT-B/16 at 224 px, as Appendix D.
PAPER_MODEL = dict(img_size=224)
PAPER_TRAIN = dict(recipe="paper-pretrain", epochs=7.0, batch_size=4096, lr=8e-4, weight_decay=0.1, warmup=10_000,
                   random_resized_crop=0.08, hflip=True)


def scale_settings(scale: str, quick: bool, data: str | None, data_dir: str | None,
                   costly: bool = False) -> tuple[dict, dict]:
    """(model options, training options) of a base run at this scale; `costly` ablations (models of
    several times the base's compute) train on part of the data at the CPU scale."""
    if quick:
        model, train = dict(QUICK_MODEL), dict(QUICK_TRAIN)
    elif scale == "cpu":
        model, train = dict(CPU_MODEL), dict(CPU_TRAIN)
        if costly:
            train["train_limit"] = CPU_COSTLY_TRAIN_LIMIT
    elif scale == "paper":
        if not data:
            raise ValueError("--scale paper needs --data (an ImageFolder directory, cifar10 or cifar100)")
        model, train = dict(PAPER_MODEL), dict(PAPER_TRAIN)
    else:
        raise ValueError(f"unknown scale {scale!r}: use cpu or paper")
    if data:
        train["data"] = data
    if data_dir:
        train["data_dir"] = data_dir
    return model, train


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
        model, summary = fit_model(train)
        history = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    steps_per_epoch = summary["step"] / summary["epochs"] if summary["epochs"] else 1.0
    curve = [{"epoch": h["step"] / steps_per_epoch, "test_acc": h["eval_top1"]} for h in history if "eval_top1" in h]
    return model, {
        "metrics": {"test_acc": summary["test_top1"], "fewshot_5": summary["fewshot"].get("5"), "curve": curve,
                    "final_loss": summary["final_loss"], "images_per_s": summary["images_per_s"]},
        "flops": training_flops(model, summary["images_seen"]),
        "params": summary["params"],
        "model_config": summary["model_config"],
    }


def per_epoch_eval(train: dict, per_epoch: int = 1) -> dict:
    """Evaluate `per_epoch` times an epoch (for accuracy-vs-epoch curves)."""
    batch = train["batch_size"]
    images = train.get("train_limit") or 60_000
    return {**train, "eval_every": max(1, images // batch // per_epoch)}
