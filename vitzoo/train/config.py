"""TrainConfig: every training knob in one dataclass, saved as `train_config.json` in the run.

A recipe fills the knobs left at None (the paper's Tables 3 and 4; `small`: small models in
minutes on a CPU), its warm-up capped at a tenth of the run. A field's metadata holds its help and
rules (`vitzoo.options.option`): the one source of the checks and of the flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vitzoo.errors import ConfigError
from vitzoo.options import Options, check_fields, option
from vitzoo.precision import PRECISIONS

RECIPES: dict[str, dict[str, Any]] = {
    "paper-pretrain": dict(optimizer="adamw", lr=1e-3, batch_size=512, weight_decay=0.1,
                           betas=(0.9, 0.999), momentum=0.9, schedule="linear", warmup=10_000,
                           clip_grad=1.0, reset_head=False),
    "paper-finetune": dict(optimizer="sgd", lr=0.01, batch_size=512, weight_decay=0.0,
                           betas=(0.9, 0.999), momentum=0.9, schedule="cosine", warmup=500,
                           clip_grad=1.0, reset_head=True),
    "small": dict(optimizer="adamw", lr=2e-3, batch_size=128, weight_decay=0.05, betas=(0.9, 0.999),
                  momentum=0.9, schedule="linear", warmup=0.05, clip_grad=1.0, reset_head=False),
}
DEVICES = ("auto", "cpu", "cuda", "mps")
DEFAULT_EPOCHS = 10
# what may differ between a run and its resumption: none of them changes what is computed
RESUMABLE = {"resume", "stop_at", "quiet", "num_workers", "log_every", "eval_every", "out",
             "checkpoint_every", "checkpoint_every_min", "keep_checkpoints", "device", "compile",
             "tensorboard", "download", "decode", "fewshot"}


PATHS = ("pretrained", "data", "data_dir", "out")  # "" would be the current directory, or none
POS, NONNEG = "> 0", ">= 0"


@dataclass
class TrainConfig(Options):
    """One training run. Knobs left at None come from the recipe."""

    KIND = "training"  # in errors: "unknown training option ..."

    model: str = option("vit_ti16", help="model name, or a pretrained tag MODEL.TAG (vitzoo list)")
    model_options: dict = option({}, help="ViTConfig options")
    pretrained: str | None = option(None, help="start from these weights: a tag, hf-hub:ORG/NAME"
                                    "[@REV], a saved directory or a weights file")
    # data
    data: str = option("fashion-mnist", help="fashion-mnist | cifar10 | cifar100 | oxford-pets | "
                       "flowers102 | synthetic | an image folder | its shards")
    data_dir: str | None = option(None, help="the named datasets' folder ($VITZOO_CACHE/datasets)")
    download: bool = option(False, help="fetch a named dataset that is missing (MD5-checked)")
    train_limit: int | None = option(None, help="train on a fixed random subset of this many",
                                     range=POS)
    test_limit: int | None = option(None, help="test on this many images", range=POS)
    val_size: int = option(0, help="hold out this many training images for --eval-every, the same "
                           "for every --seed and --train-limit", range=NONNEG)
    classes: tuple[int, ...] | None = option(None, help="keep these classes, renumbered in this "
                                             "order", range=NONNEG)
    num_workers: int = option(0, help="data loader worker processes", range=NONNEG)
    decode: str = option("auto", help="where image files are decoded (auto: on a CUDA device)",
                         choices=("auto", "workers", "device"))
    random_resized_crop: float = option(0.0, help="RandomResizedCrop's min scale",
                                        range="in [0, 1]")
    crop_padding: int = option(0, help="random crop after zero padding by this many pixels",
                               range=NONNEG)
    hflip: bool = option(False, help="random horizontal flips")
    randaugment: int = option(0, help="RandAugment's magnitude (2 ops)", range=NONNEG)
    mixup: float = option(0.0, help="MixUp's alpha", range=NONNEG)
    cutmix: float = option(0.0, help="CutMix's alpha", range=NONNEG)
    # the recipe and its knobs
    recipe: str = option("paper-pretrain", help="the knobs left out", choices=tuple(RECIPES))
    optimizer: str | None = option(None, choices=("adamw", "sgd"))
    lr: float | None = option(None, help="peak learning rate", range=POS)
    batch_size: int | None = option(None, help="global batch size, whatever the processes",
                                    range=POS)
    micro_batch: int | None = option(None, help="images a forward pass (the rest accumulated)",
                                     range=POS)
    weight_decay: float | None = option(None, help="decoupled (AdamW) or L2 (SGD)", range=NONNEG)
    betas: tuple[float, float] | None = option(None, help="AdamW's", range="in [0, 1)")
    momentum: float | None = option(None, help="SGD's", range=NONNEG)
    schedule: str | None = option(None, help="decay after the warm-up",
                                  choices=("linear", "cosine", "constant"))
    warmup: float | None = option(None, help="steps (>= 1) or a fraction of the run", range=NONNEG)
    clip_grad: float | None = option(None, help="clip the gradient norm to this (0: off)",
                                     range=NONNEG)
    reset_head: bool | None = option(None, help="replace the head by a zero-initialised linear")
    label_smoothing: float = option(0.0, range="in [0, 1)")
    layer_decay: float | None = option(None, help="block i of L learns at R**(L-i) times the rate",
                                       range="in (0, 1]")
    model_ema: bool = option(False, help="keep a moving average of the weights "
                             "(model_ema.safetensors)")
    model_ema_decay: float = option(0.9998, help="the average spans about 1/(1-decay) steps",
                                    range="in [0, 1)")
    model_ema_warmup: bool = option(False, help="update t's decay: min(decay, (1+t)/(10+t))")
    # the length: one of these (default 10 epochs)
    epochs: float | None = option(None, range=POS)
    steps: int | None = option(None, help="optimizer steps", range=POS)
    time_budget_min: float | None = option(None, help="minutes; the schedule follows the clock",
                                           range=POS)
    stop_at: int | None = option(None, help="stop with a checkpoint at this step", range=POS)
    # devices and numerics
    device: str = option("auto", choices=DEVICES)
    precision: str = option("auto", help="auto: the GPU's half precision, fp32 elsewhere",
                            choices=PRECISIONS)
    compile: bool = option(False, help="torch.compile the model")
    grad_checkpointing: bool = option(False, help="recompute blocks in the backward pass")
    seed: int = option(0, help="initial weights, data order, augmentation", range=NONNEG)
    # output
    out: str | None = option(None, help="run directory (None: write nothing)")
    resume: bool = option(False, help="continue the run in --out from its last checkpoint")
    checkpoint_every: int = option(1000, help="steps between checkpoints, also at each epoch's "
                                   "end and the end (0: the end only)", range=NONNEG)
    checkpoint_every_min: float = option(10.0, help="minutes of training between checkpoints",
                                         range=NONNEG)
    keep_checkpoints: int = option(1, range=POS)
    eval_every: int = option(0, help="steps between evaluations (0: the end only)", range=NONNEG)
    keep_best: bool = option(False, help="end with the weights of the best validation top-1 "
                             "(needs --val-size and --eval-every)")
    log_every: int = option(10, help="steps between metrics lines", range=POS)
    fewshot: tuple[int, ...] = option((), help="few-shot linear accuracy of these shots at the end",
                                      range=POS)
    quiet: bool = option(False, help="no progress bar and no messages")
    tensorboard: bool = option(True, help="also write TensorBoard logs (if installed)")

    def __post_init__(self) -> None:
        for name in ("betas", "classes", "fewshot"):  # a JSON file holds them as lists
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))
        check_fields(self)
        for name in PATHS:
            if (value := getattr(self, name)) is not None and not value.strip():
                what = "blank" if value else "empty"
                raise ConfigError(f"{name}={value!r} is {what}: name a path, or leave {name} out")
        given = [n for n in ("epochs", "steps", "time_budget_min") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ConfigError(f"give one of epochs, steps, time_budget_min, not {', '.join(given)}")
        if self.classes is not None and (not self.classes
                                         or len(set(self.classes)) < len(self.classes)):
            raise ConfigError(f"classes={self.classes}: name each class once, e.g. 0,1,2,3,4")
        if self.keep_best and not (self.val_size and self.eval_every):
            raise ConfigError("keep_best picks the best evaluation on a validation set: give "
                              "--val-size and --eval-every (> 0)")
        if self.resume and not self.out:
            raise ConfigError("resume needs the run directory (out)")

    def resolved(self) -> TrainConfig:
        """A copy with the recipe's knobs where None (the warm-up waits for the run's length)."""
        recipe = RECIPES[self.recipe]
        changes = {k: v for k, v in recipe.items() if k != "warmup" and getattr(self, k) is None}
        if self.epochs is None and self.steps is None and self.time_budget_min is None:
            changes["epochs"] = DEFAULT_EPOCHS
        return dataclasses.replace(self, **changes)

    def recipe_warmup(self, total_steps: int | None) -> float:
        """The recipe's warm-up steps, at most a tenth of the run (a time budget: its tenth)."""
        if total_steps is None:
            return 0.1
        return float(min(RECIPES[self.recipe]["warmup"], total_steps // 10))

    def batch_split(self, world_size: int) -> tuple[int, int]:
        """(micro, accum): each process computes its share of the global batch in `accum`
        micro-batches of `micro` images."""
        micro = self.micro_batch or self.batch_size // world_size
        if micro < 1 or self.batch_size % (world_size * micro):
            raise ConfigError(f"batch_size={self.batch_size} is not a multiple of "
                              f"world_size={world_size} x micro_batch={micro}")
        return micro, self.batch_size // (world_size * micro)
