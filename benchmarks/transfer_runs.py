"""How a run of the transfer benchmark (`benchmarks.ablations.transfer`) is measured, and what its
rehearsal needs: small generated datasets and weights served by a Hub.

A run is measured in its own folder, each training in a subfolder of it (resumed, or read back once
finished, as `benchmarks.training.train` does for every run):

- small scales (the config has `transfer`): pre-train upstream in OUT/train; the 5-shot linear accuracy
  of its frozen features on the downstream classes; fine-tune it on them in OUT/finetune/train.
- the paper's scales (the config has `sweep`): fine-tune the tag's weights once per learning rate of
  the sweep on the training set less the development split (OUT/lr<LR>/train), keep the rate with the
  best development accuracy (ties: the first), and fine-tune on the whole training set at it
  (OUT/final/train).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path
from typing import Any, Iterator

import vitzoo
from benchmarks.rehearsal_data import FolderSpec, image_folder
from benchmarks.suite import Run
from benchmarks.training import train, train_settings


def measure(run: Run, device: str, out: Path) -> dict[str, Any]:
    if "sweep" in run.config:
        return measure_finetune(run, device, Path(out))
    return measure_transfer(run, device, Path(out))


def _with_train(run: Run, train: dict) -> Run:
    return dataclasses.replace(run, config={"model": run.config["model"], "options": run.config["options"], "train": train})


# ------------------------------------------------------------------------- small scales
def downstream_fewshot(model: vitzoo.VisionTransformer, run: Run, device: str) -> float:
    """The k-shot linear accuracy of the model's frozen pre-logits features on the downstream classes:
    k images of each drawn from the downstream training images (five draws), tested on the downstream
    test images (the paper's closed-form few-shot evaluation, `vitzoo.evaluate`)."""
    from vitzoo import data as datasets
    from vitzoo.evaluate import fewshot_linear_accuracy
    from vitzoo.train import TrainConfig
    from vitzoo.train.inputs import load_splits
    from vitzoo.train.loop import resolve_model

    transfer = run.config["transfer"]
    cfg = TrainConfig(model=run.config["model"], model_options=dict(run.config["options"]), seed=run.seed, device=device,
                      **train_settings({"train": transfer["finetune"]})).resolved()
    train_raw, _, test_raw, _ = load_splits(cfg, resolve_model(cfg).config)
    plain = datasets.build_transform(model.config.img_size, None)
    shots = transfer["shots"]
    accuracy = fewshot_linear_accuracy(model, datasets.Transformed(train_raw, plain), datasets.Transformed(test_raw, plain),
                                       shots=(shots,), draws=5, seed=run.seed)
    return accuracy[shots]


def measure_transfer(run: Run, device: str, out: Path) -> dict[str, Any]:
    """Pre-train upstream, then the downstream 5-shot accuracy of its frozen features and its accuracy
    fine-tuned on the downstream classes; the record is the upstream run's, with the downstream metrics
    added and the fine-tuning's FLOPs counted in."""
    model, upstream = train(_with_train(run, run.config["train"]), device, out)
    fewshot = downstream_fewshot(model, run, device)
    finetune = {**run.config["transfer"]["finetune"], "pretrained": str((out / "train").resolve())}
    _, tuned = train(_with_train(run, finetune), device, out / "finetune")
    metrics = {**upstream["metrics"], f"transfer_fewshot_{run.config['transfer']['shots']}": fewshot,
               "transfer_finetune": tuned["metrics"]["test_acc"], "finetune_curve": tuned["metrics"]["curve"],
               "finetune_final_loss": tuned["metrics"]["final_loss"]}
    return {**upstream, "metrics": metrics, "flops": upstream["flops"] + tuned["flops"], "upstream_flops": upstream["flops"]}


# ------------------------------------------------------------------------- the paper's scales
def development_accuracy(outcome: dict[str, Any]) -> float:
    """The accuracy on the development split at the end of a sweep's fine-tuning."""
    curve = outcome["metrics"].get("val_curve")
    if not curve:
        raise RuntimeError("a sweep's fine-tuning evaluated nothing on its development split (eval_every not set?)")
    return curve[-1]["val_acc"]


def measure_finetune(run: Run, device: str, out: Path) -> dict[str, Any]:
    """Appendix B.1.1: the learning rate chosen on a development split, then the whole training set."""
    train, sweep = run.config["train"], run.config["sweep"]
    if Path(train["data"]).parent.name == REHEARSAL_FOLDER:
        rehearsal_data(train["data"])  # the rehearsal's generated dataset (written once, by whichever process is first)
    development = {}
    for lr in sweep["lrs"]:
        dev = {**train, "lr": lr, "val_size": sweep["dev"], "eval_every": train["steps"]}
        _, outcome = train_one(run, dev, device, out / f"lr{lr:g}")
        development[lr] = development_accuracy(outcome)
    best = max(sweep["lrs"], key=lambda lr: development[lr])  # max keeps the first of equals
    _, final = train_one(run, {**train, "lr": best}, device, out / "final")
    final["metrics"].update(lr=best, development={f"{lr:g}": acc for lr, acc in development.items()})
    return final


def train_one(run: Run, settings: dict, device: str, out: Path):
    return train(_with_train(run, settings), device, out)


# ------------------------------------------------------------------------- the rehearsal
# Each dataset a small JPEG folder in ImageNet's layout (benchmarks.rehearsal_data), beside the
# rehearsal's ImageNet: a tenth of its classes (10 at most, 2 at least), 8 training and 4 test images each.
REHEARSAL_CLASSES = {"cifar10": 10, "cifar100": 100, "oxford-pets": 37, "flowers102": 102}
REHEARSAL_FOLDER = "rehearsal-transfer"


def rehearsal_spec(dataset: str) -> FolderSpec:
    classes = REHEARSAL_CLASSES[dataset]
    return FolderSpec(classes=max(2, min(10, classes // 10 if classes > 10 else classes)), train_per_class=8,
                      val_per_class=4, seed=sorted(REHEARSAL_CLASSES).index(dataset) + 1)


def rehearsal_folder(imagenet: str | os.PathLike, dataset: str) -> Path:
    """Where the rehearsal's stand-in for `dataset` lies: beside its ImageNet folder."""
    return (Path(imagenet).parent / REHEARSAL_FOLDER / dataset).resolve()


def rehearsal_data(folder: str | os.PathLike, write: bool = True) -> Path:
    """The stand-in folder written (once) for the dataset it is named after; `write=False`: planned only."""
    return image_folder(folder, rehearsal_spec(Path(folder).name), write=write)


REHEARSAL_NAMESPACE = "rehearsal"
PRETRAINING_SIDE = 32  # the tags' 224 px, shrunk as the rehearsal shrinks images


def rehearsal_repo(tag: str) -> str:
    return f"{REHEARSAL_NAMESPACE}/{tag}"


def rehearsal_weights(tag: str, seed: int = 0) -> vitzoo.VisionTransformer:
    """A stand-in for the tag's weights: its model shrunk as the rehearsal shrinks every model, at the
    tag's resolution shrunk (the run fine-tunes at 384 px shrunk: the position embedding is resampled,
    as the paper's), with the tag's head (none for the ImageNet-21k features), random weights."""
    import torch

    from benchmarks.scales import rehearsal_model
    from vitzoo.registry import get_registry

    pretrained = get_registry().get("pretrained_tag", tag)
    options = rehearsal_model(pretrained.model, {"img_size": PRETRAINING_SIDE})
    torch.manual_seed(seed)
    return vitzoo.create(pretrained.model, **options, num_classes=pretrained.num_classes)


def publish_rehearsal_weights(tags: list[str], endpoint: str, token: str | None = None) -> list[str]:
    """Push each tag's stand-in weights to `endpoint` as `rehearsal/TAG`; returns the repos."""
    repos = []
    for tag in tags:
        repos.append(rehearsal_repo(tag))
        rehearsal_weights(tag).push_to_hub(repos[-1], token=token, endpoint=endpoint)
    return repos


@contextlib.contextmanager
def serve_weights(root: Path, tags: list[str]) -> Iterator[str]:
    """A loopback Hub (tests.hubserver) under `root` serving every tag's stand-in weights, with
    HF_ENDPOINT pointing at it while the rehearsal runs (its processes inherit it); yields its URL."""
    from tests.hubserver import HubServer

    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HUB_DISABLE_XET")}
    with HubServer(Path(root)) as server:
        os.environ.update(HF_ENDPOINT=server.url, HF_HUB_DISABLE_XET="1")  # the loopback Hub has no Xet storage
        try:
            publish_rehearsal_weights(tags, server.url)
            yield server.url
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


__all__ = ["measure", "publish_rehearsal_weights", "rehearsal_data", "rehearsal_folder", "rehearsal_repo",
           "rehearsal_spec", "rehearsal_weights", "serve_weights"]
