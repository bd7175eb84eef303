"""TrainConfig: every training knob in one dataclass, saved as `train_config.json` in the run.

A recipe fills the knobs left at None (the paper's Tables 3 and 4; `small`: small models in
minutes on a CPU), its warm-up capped at a tenth of the run. A field's metadata holds its help and
rules (`range`, `choices`, `items`, `path`): the one source of the checks and of the flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vitzoo.errors import ConfigError
from vitzoo.options import Options, check_fields, check_number
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
             "tensorboard", "download", "decode"}


def check_options(options: Any) -> None:
    """Every field of the options dataclass by its metadata: its type and `range` (check_fields),
    its `choices`, each of a tuple's `items`, and a `path` that is neither empty nor blank."""
    fields = dataclasses.fields(options)
    check_fields(options, {f.name: f.metadata["range"] for f in fields if "range" in f.metadata})
    for f in fields:
        value, rules = getattr(options, f.name), f.metadata
        if value is None:
            continue
        if "items" in rules and not isinstance(value, tuple):
            raise ConfigError(f"{f.name} must be a sequence of numbers, got {value!r}")
        for item in value if "items" in rules else ():
            check_number(f.name, item, rules["items"], rules.get("range"))
        if "choices" in rules and value not in rules["choices"]:
            raise ConfigError(f"{f.name}={value!r} is not one of {', '.join(rules['choices'])}")
        if rules.get("path") and not value.strip():
            what = "blank" if value else "empty"
            raise ConfigError(f"{f.name}={value!r} is {what}: name a path, or leave {f.name} out")


def knob(default: Any, help: str, **rules: Any) -> Any:
    """A field, its help and its rules."""
    return field(default=default, metadata={"help": help, **rules})


POSITIVE, NONNEGATIVE = {"range": "> 0"}, {"range": ">= 0"}


@dataclass
class TrainConfig(Options):
    """One training run. Knobs left at None come from the recipe."""

    KIND = "training"  # in errors: "unknown training option ..."

    model: str = knob("vit_ti16", "model name, or a pretrained tag MODEL.TAG (vitzoo list)")
    model_options: dict = field(default_factory=dict, metadata={"help": "ViTConfig options"})
    pretrained: str | None = knob(None, "start from these weights: a tag, hf-hub:ORG/NAME[@REV], "
                                  "a saved directory or a weights file", path=True)
    # data
    data: str = knob("fashion-mnist", "fashion-mnist | cifar10 | cifar100 | oxford-pets | "
                     "flowers102 | synthetic | an image folder | its shards", path=True)
    data_dir: str | None = knob(None, "the named datasets' folder ($VITZOO_CACHE/datasets)",
                                path=True)
    download: bool = knob(False, "fetch a named dataset that is missing (MD5-checked)")
    train_limit: int | None = knob(None, "train on a fixed random subset of this many", **POSITIVE)
    test_limit: int | None = knob(None, "test on this many images", **POSITIVE)
    val_size: int = knob(0, "hold out this many training images for --eval-every, the same for "
                         "every --seed and --train-limit", **NONNEGATIVE)
    classes: tuple[int, ...] | None = knob(None, "keep these classes, renumbered in this order",
                                           items=int, **NONNEGATIVE)
    num_workers: int = knob(0, "data loader worker processes", **NONNEGATIVE)
    decode: str = knob("auto", "where image files are decoded (auto: on a CUDA device)",
                       choices=("auto", "workers", "device"))
    random_resized_crop: float = knob(0.0, "RandomResizedCrop's min scale", range="in [0, 1]")
    crop_padding: int = knob(0, "random crop after zero padding by this many pixels",
                             **NONNEGATIVE)
    hflip: bool = knob(False, "random horizontal flips")
    randaugment: int = knob(0, "RandAugment's magnitude (2 ops)", **NONNEGATIVE)
    mixup: float = knob(0.0, "MixUp's alpha", **NONNEGATIVE)
    cutmix: float = knob(0.0, "CutMix's alpha", **NONNEGATIVE)
    # the recipe and its knobs
    recipe: str = knob("paper-pretrain", "the knobs left out", choices=tuple(RECIPES))
    optimizer: str | None = knob(None, "", choices=("adamw", "sgd"))
    lr: float | None = knob(None, "peak learning rate", **POSITIVE)
    batch_size: int | None = knob(None, "global batch size, whatever the processes", **POSITIVE)
    micro_batch: int | None = knob(None, "images a forward pass (the rest accumulated)",
                                   **POSITIVE)
    weight_decay: float | None = knob(None, "decoupled (AdamW) or L2 (SGD)", **NONNEGATIVE)
    betas: tuple[float, float] | None = knob(None, "AdamW's", items=float, range="in [0, 1)")
    momentum: float | None = knob(None, "SGD's", **NONNEGATIVE)
    schedule: str | None = knob(None, "decay after the warm-up",
                                choices=("linear", "cosine", "constant"))
    warmup: float | None = knob(None, "steps (>= 1) or a fraction of the run", **NONNEGATIVE)
    clip_grad: float | None = knob(None, "clip the gradient norm to this (0: off)", **NONNEGATIVE)
    reset_head: bool | None = knob(None, "replace the head by a zero-initialised linear layer")
    label_smoothing: float = knob(0.0, "", range="in [0, 1)")
    layer_decay: float | None = knob(None, "block i of L learns at R**(L-i) times the rate",
                                     range="in (0, 1]")
    model_ema: bool = knob(False, "keep a moving average of the weights (model_ema.safetensors)")
    model_ema_decay: float = knob(0.9998, "the average spans about 1/(1-decay) steps",
                                  range="in [0, 1)")
    model_ema_warmup: bool = knob(False, "update t's decay: min(decay, (1+t)/(10+t))")
    # the length: one of these (default 10 epochs)
    epochs: float | None = knob(None, "", **POSITIVE)
    steps: int | None = knob(None, "optimizer steps", **POSITIVE)
    time_budget_min: float | None = knob(None, "minutes; the schedule follows the clock",
                                         **POSITIVE)
    stop_at: int | None = knob(None, "stop with a checkpoint at this step", **POSITIVE)
    # devices and numerics
    device: str = knob("auto", "", choices=DEVICES)
    precision: str = knob("auto", "auto: the GPU's half precision, fp32 elsewhere",
                          choices=PRECISIONS)
    compile: bool = knob(False, "torch.compile the model")
    grad_checkpointing: bool = knob(False, "recompute blocks in the backward pass (less memory)")
    seed: int = knob(0, "initial weights, data order, augmentation", **NONNEGATIVE)
    # output
    out: str | None = knob(None, "run directory (None: write nothing)", path=True)
    resume: bool = knob(False, "continue the run in --out from its last checkpoint")
    checkpoint_every: int = knob(1000, "steps between checkpoints, also at each epoch's end and "
                                 "the end (0: the end only)", **NONNEGATIVE)
    checkpoint_every_min: float = knob(10.0, "minutes of training between checkpoints",
                                       **NONNEGATIVE)
    keep_checkpoints: int = knob(1, "", **POSITIVE)
    eval_every: int = knob(0, "steps between evaluations (0: the end only)", **NONNEGATIVE)
    keep_best: bool = knob(False, "end with the weights of the best validation top-1 (needs "
                           "--val-size and --eval-every)")
    log_every: int = knob(10, "steps between metrics lines", **POSITIVE)
    fewshot: tuple[int, ...] = knob((), "few-shot linear accuracy of these shots at the end",
                                    items=int, **POSITIVE)
    quiet: bool = knob(False, "no progress bar and no messages")
    tensorboard: bool = knob(True, "also write TensorBoard logs (if installed)")

    def __post_init__(self) -> None:
        for name in ("betas", "classes", "fewshot"):  # a JSON file holds them as lists
            if isinstance(getattr(self, name), list):
                setattr(self, name, tuple(getattr(self, name)))
        check_options(self)
        given = [n for n in ("epochs", "steps", "time_budget_min") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ConfigError(f"give one of epochs, steps, time_budget_min, not {', '.join(given)}")
        if self.classes is not None and (not self.classes
                                         or len(set(self.classes)) < len(self.classes)):
            raise ConfigError(f"classes={self.classes}: name each class once, e.g. 0,1,2,3,4")
        if self.keep_best and not (self.val_size and self.eval_every):
            missing = [flag for flag, value in (("--val-size N", self.val_size),
                                                ("--eval-every K", self.eval_every)) if not value]
            raise ConfigError("keep_best picks the best evaluation on a validation set: give "
                              f"{' and '.join(missing)} (> 0)")
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
