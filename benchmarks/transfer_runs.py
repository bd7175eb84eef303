"""How a run of the transfer benchmark (`benchmarks.ablations.transfer`) is measured, each
training in a folder of its own under the run's. Small scales (the config has `transfer`):
pre-train upstream in OUT/train, the 5-shot linear accuracy of its frozen features on the
downstream classes, then fine-tune on them in OUT/finetune. The paper's (`sweep`): fine-tune the
tag's weights at each rate of the sweep on the training set less a development split (OUT/lr<LR>),
then on the whole set at the rate best on it (OUT/final). The rehearsal's: small JPEG folders for
the datasets, and stand-in weights on a loopback Hub.
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
    return (measure_finetune if "sweep" in run.config else measure_transfer)(run, device, Path(out))


def _trained(run: Run, settings: dict, device: str, out: Path):
    config = {"model": run.config["model"], "options": run.config["options"], "train": settings}
    return train(dataclasses.replace(run, config=config), device, out)


def downstream_fewshot(model: vitzoo.VisionTransformer, run: Run, device: str) -> float:
    """The k-shot linear accuracy of the frozen features on the downstream classes (five draws)."""
    from vitzoo import data as datasets
    from vitzoo.evaluate import fewshot_linear_accuracy
    from vitzoo.train import TrainConfig
    from vitzoo.train.inputs import load_splits
    from vitzoo.train.loop import resolve_model

    transfer = run.config["transfer"]
    cfg = TrainConfig(model=run.config["model"], model_options=dict(run.config["options"]),
                      seed=run.seed, device=device,
                      **train_settings({"train": transfer["finetune"]})).resolved()
    train_raw, _, test_raw, _ = load_splits(cfg, resolve_model(cfg).config)
    plain = datasets.build_transform(model.config.img_size, None)
    shots = transfer["shots"]
    return fewshot_linear_accuracy(model, datasets.Transformed(train_raw, plain),
                                   datasets.Transformed(test_raw, plain), shots=(shots,), draws=5,
                                   seed=run.seed)[shots]


def measure_transfer(run: Run, device: str, out: Path) -> dict[str, Any]:
    """The upstream run's record, with the downstream metrics and the fine-tuning's FLOPs."""
    model, upstream = _trained(run, run.config["train"], device, out)
    fewshot = downstream_fewshot(model, run, device)
    finetune = {**run.config["transfer"]["finetune"], "pretrained": str((out / "train").resolve())}
    _, tuned = _trained(run, finetune, device, out / "finetune")
    shots = run.config["transfer"]["shots"]
    metrics = {**upstream["metrics"], f"transfer_fewshot_{shots}": fewshot,
               "transfer_finetune": tuned["metrics"]["test_acc"],
               "finetune_curve": tuned["metrics"]["curve"],
               "finetune_final_loss": tuned["metrics"]["final_loss"]}
    return {**upstream, "metrics": metrics, "flops": upstream["flops"] + tuned["flops"],
            "upstream_flops": upstream["flops"]}


def measure_finetune(run: Run, device: str, out: Path) -> dict[str, Any]:
    """Appendix B.1.1: the learning rate chosen on a development split, then the whole set."""
    train, sweep = run.config["train"], run.config["sweep"]
    if Path(train["data"]).parent.name == REHEARSAL_FOLDER:
        rehearsal_data(train["data"])  # written once, by whichever process is first
    development = {}
    for lr in sweep["lrs"]:
        dev = {**train, "lr": lr, "val_size": sweep["dev"], "eval_every": train["steps"]}
        _, outcome = _trained(run, dev, device, out / f"lr{lr:g}")
        development[lr] = outcome["metrics"]["val_curve"][-1]["val_acc"]
    best = max(sweep["lrs"], key=lambda lr: development[lr])  # max keeps the first of equals
    _, final = _trained(run, {**train, "lr": best}, device, out / "final")
    final["metrics"].update(lr=best, development={f"{lr:g}": a for lr, a in development.items()})
    return final


# each dataset of the rehearsal a JPEG folder beside its ImageNet: a tenth of its classes
# (2 to 10), 8 training and 4 test images each
REHEARSAL_CLASSES = {"cifar10": 10, "cifar100": 100, "oxford-pets": 37, "flowers102": 102}
REHEARSAL_FOLDER = "rehearsal-transfer"
PRETRAINING_SIDE = 32  # the tags' 224 px, shrunk as the rehearsal shrinks images


def rehearsal_spec(dataset: str) -> FolderSpec:
    classes = REHEARSAL_CLASSES[dataset]
    return FolderSpec(classes=max(2, min(10, classes // 10 if classes > 10 else classes)),
                      train_per_class=8, val_per_class=4,
                      seed=sorted(REHEARSAL_CLASSES).index(dataset) + 1)


def rehearsal_folder(imagenet: str | os.PathLike, dataset: str) -> Path:
    return (Path(imagenet).parent / REHEARSAL_FOLDER / dataset).resolve()


def rehearsal_data(folder: str | os.PathLike, write: bool = True) -> Path:
    """The stand-in folder of the dataset it is named after; `write=False`: planned only."""
    return image_folder(folder, rehearsal_spec(Path(folder).name), write=write)


def rehearsal_repo(tag: str) -> str:
    return f"rehearsal/{tag}"


def rehearsal_weights(tag: str) -> vitzoo.VisionTransformer:
    """The tag's model shrunk as the rehearsal shrinks models, its head kept; random weights."""
    import torch

    from benchmarks.scales import rehearsal_model
    from vitzoo.registry import get_registry

    pretrained = get_registry().get("pretrained_tag", tag)
    options = rehearsal_model(pretrained.model, {"img_size": PRETRAINING_SIDE})
    torch.manual_seed(0)
    return vitzoo.create(pretrained.model, **options, num_classes=pretrained.num_classes)


def publish_rehearsal_weights(tags: list[str], endpoint: str) -> None:
    for tag in tags:
        rehearsal_weights(tag).push_to_hub(rehearsal_repo(tag), endpoint=endpoint)


@contextlib.contextmanager
def serve_weights(root: Path, tags: list[str]) -> Iterator[str]:
    """A loopback Hub (tests.hubserver) serving every tag's stand-in weights, HF_ENDPOINT pointing
    at it meanwhile (the rehearsal's processes inherit it); yields its URL."""
    from unittest import mock

    from tests.hubserver import HubServer

    with HubServer(Path(root)) as server, mock.patch.dict(
            os.environ, HF_ENDPOINT=server.url, HF_HUB_DISABLE_XET="1"):  # no Xet storage there
        publish_rehearsal_weights(tags, server.url)
        yield server.url
