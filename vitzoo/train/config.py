"""TrainConfig: every training knob in one dataclass, saved as `train_config.json` in the run.

A recipe fills the knobs left at None (the paper's Tables 3 and 4; `small` for small models trained
in minutes on a CPU):

| recipe | optimizer | lr | batch | weight decay | schedule | warm-up | clip | head |
|---|---|---|---|---|---|---|---|---|
| `paper-pretrain` | AdamW (0.9, 0.999) | 1e-3 | 512 | 0.1 | linear | 10k steps | 1.0 | as built |
| `paper-finetune` | SGD momentum 0.9 | 0.01 | 512 | 0 | cosine | 500 steps | 1.0 | zero linear |
| `small` | AdamW (0.9, 0.999) | 2e-3 | 128 | 0.05 | linear | 5% of the run | 1.0 | as built |

A recipe's warm-up is capped at a tenth of the run; one given is used as given.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from vitzoo.errors import ConfigError
from vitzoo.options import Options, check_fields, check_number
from vitzoo.precision import PRECISIONS  # --precision's values (vitzoo.precision owns them)

RECIPES: dict[str, dict[str, Any]] = {
    "paper-pretrain": dict(optimizer="adamw", lr=1e-3, batch_size=512, weight_decay=0.1,
                           betas=(0.9, 0.999), momentum=0.9, schedule="linear", warmup=10_000,
                           clip_grad=1.0, reset_head=False),
    "paper-finetune": dict(optimizer="sgd", lr=0.01, batch_size=512, weight_decay=0.0,
                           betas=(0.9, 0.999), momentum=0.9, schedule="cosine", warmup=500,
                           clip_grad=1.0, reset_head=True),
    # the CPU benchmark scales' (benchmarks/scales.py): small models in minutes on a CPU
    "small": dict(optimizer="adamw", lr=2e-3, batch_size=128, weight_decay=0.05, betas=(0.9, 0.999),
                  momentum=0.9, schedule="linear", warmup=0.05, clip_grad=1.0, reset_head=False),
}
OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("linear", "cosine", "constant")
DEVICES = ("auto", "cpu", "cuda", "mps")
DECODES = ("auto", "workers", "device")
DEFAULT_EPOCHS = 10
# options that name a path (or a dataset, tag or repo): an empty or blank one is refused, never
# read as "none" or as the current directory
PATH_OPTIONS = ("pretrained", "data", "data_dir", "out")

# fields that may differ between a run and its resumption (they do not change what is computed);
# `out` too: a run directory moved or copied elsewhere is the same run
RESUMABLE_CHANGES = {"resume", "stop_at", "quiet", "num_workers", "log_every", "eval_every",
                     "checkpoint_every", "checkpoint_every_min", "keep_checkpoints", "device",
                     "compile", "tensorboard", "out", "download", "decode"}

# the range of every number option (`check_fields` checks them all, and every type, as one
# ConfigError before any data loads); options not named take any int or finite number
NUMBER_RANGES = {
    **dict.fromkeys(("lr", "batch_size", "micro_batch", "epochs", "steps", "time_budget_min",
                     "stop_at", "train_limit", "test_limit", "log_every", "keep_checkpoints"),
                    "> 0"),
    **dict.fromkeys(("val_size", "num_workers", "crop_padding", "randaugment", "mixup", "cutmix",
                     "weight_decay", "momentum", "warmup", "clip_grad", "checkpoint_every",
                     "checkpoint_every_min", "eval_every", "seed"), ">= 0"),
    "random_resized_crop": "in [0, 1]",
    "label_smoothing": "in [0, 1)",
    "layer_decay": "in (0, 1]",
    "model_ema_decay": "in [0, 1)",
}


def _help(text: str, **kwargs) -> Any:
    return field(metadata={"help": text}, **kwargs)


@dataclass
class TrainConfig(Options):
    """One training run. Knobs left at None come from the recipe."""

    KIND = "training"  # in errors: "unknown training option ..."

    model: str = _help(
        "registered model name, or a pretrained tag MODEL.TAG for its architecture and "
        "preprocessing (vitzoo list)", default="vit_ti16")
    model_options: dict = _help("ViTConfig options for vitzoo.create", default_factory=dict)
    pretrained: str | None = _help(
        "start from these weights: a pretrained tag (MODEL.TAG[@REV]), a Hub repo "
        "(hf-hub:ORG/NAME[@REV]), a save_pretrained directory, or a weights file of any format "
        "vitzoo reads", default=None)
    # data
    data: str = _help(
        "fashion-mnist | cifar10 | cifar100 | oxford-pets | flowers102 | synthetic | an "
        "ImageFolder directory | its WebDataset shards: their folder (vitzoo shard) or "
        "DIR/train-{000000..000127}.tar (docs/datasets.md)", default="fashion-mnist")
    data_dir: str | None = _help(
        "where the named dataset's files are (default $VITZOO_CACHE/datasets, i.e. "
        "~/.cache/vitzoo/datasets; Fashion-MNIST: the Debian package first)", default=None)
    download: bool = _help(
        "fetch a named dataset that is not in --data-dir through torchvision, its archives' MD5 "
        "checksums verified (offline: put the archives the error names there)", default=False)
    train_limit: int | None = _help(
        "use only this many training images (a fixed random subset)", default=None)
    test_limit: int | None = _help("evaluate on only this many test images", default=None)
    val_size: int = _help(
        "hold out this many training images as a validation set, never trained on: the same images"
        " whatever --seed and --train-limit (taken before --train-limit subsets the rest); "
        "--eval-every then evaluates on them instead of the test set (0: off)", default=0)
    classes: tuple[int, ...] | None = _help(
        "train and evaluate on these classes of the dataset only, renumbered 0, 1, ... in the "
        "order given (0,1,2,3,4: the first half of a 10-class dataset; taken before --val-size and"
        " the limits)", default=None)
    num_workers: int = _help("data loader worker processes", default=0)
    decode: str = _help(
        "where image files are decoded: workers (in the loader workers, on the CPU) | device (the "
        "workers read the bytes, the training process decodes each batch on its device, nvJPEG on "
        "a GPU, and crops, resizes and flips it there) | auto (device on CUDA for a dataset of "
        "image files, else workers)", default="auto")
    random_resized_crop: float = _help("RandomResizedCrop min scale (0: off)", default=0.0)
    crop_padding: int = _help(
        "random crop after zero padding by this many pixels (0: off)", default=0)
    hflip: bool = _help("random horizontal flips", default=False)
    randaugment: int = _help("RandAugment magnitude, 2 ops (0: off)", default=0)
    mixup: float = _help("MixUp alpha (0: off)", default=0.0)
    cutmix: float = _help("CutMix alpha (0: off)", default=0.0)
    # recipe and its knobs
    recipe: str = _help(
        "paper-pretrain | paper-finetune | small (the CPU scales': small models in minutes)",
        default="paper-pretrain")
    optimizer: str | None = _help("adamw | sgd", default=None)
    lr: float | None = _help("peak learning rate", default=None)
    batch_size: int | None = _help("global batch size (fixed across world sizes)", default=None)
    micro_batch: int | None = _help(
        "images per forward pass and process; the rest is gradient accumulation", default=None)
    weight_decay: float | None = _help("decoupled weight decay (AdamW) / L2 (SGD)", default=None)
    betas: tuple[float, float] | None = _help("AdamW betas", default=None)
    momentum: float | None = _help("SGD momentum", default=None)
    schedule: str | None = _help("linear | cosine | constant decay after the warm-up", default=None)
    warmup: float | None = _help(
        "warm-up: steps (>= 1) or a fraction of the run (< 1)", default=None)
    clip_grad: float | None = _help("clip the global gradient norm to this (0: off)", default=None)
    reset_head: bool | None = _help(
        "replace the head by a zero-initialised linear layer", default=None)
    label_smoothing: float = _help("label smoothing of the cross-entropy", default=0.0)
    layer_decay: float | None = _help(
        "layer-wise learning-rate decay R (BEiT's, timm's --layer-decay, for fine-tuning): block i"
        " of L learns at R**(L-i) times the rate, the embedding at R**(L+1), the head at the rate "
        "itself; timm's create_optimizer_v2(layer_decay=R) groups (None: off)", default=None)
    model_ema: bool = _help(
        "also keep an exponential moving average of the weights, updated after every step; "
        "evaluated beside the raw weights and saved as model_ema.safetensors (vitzoo eval RUN "
        "--ema)", default=False)
    model_ema_decay: float = _help(
        "the EMA's decay: it averages about the last 1/(1-decay) steps (0.9998, timm's default: "
        "5000 steps; for a run of hundreds of steps take 0.99 or --model-ema-warmup)",
        default=0.9998)
    model_ema_warmup: bool = _help(
        "the EMA's decay of update t is min(decay, (1+t)/(10+t)), so that a short run's average is"
        " not mostly its initial weights", default=False)
    # length: one of these (default 10 epochs)
    epochs: float | None = _help("train for this many epochs", default=None)
    steps: int | None = _help("train for this many optimizer steps", default=None)
    time_budget_min: float | None = _help(
        "train for this many minutes; the schedule follows the clock", default=None)
    stop_at: int | None = _help(
        "stop (with a checkpoint) at this step, before the schedule ends", default=None)
    # devices and numerics
    device: str = _help("auto | cpu | cuda | mps", default="auto")
    precision: str = _help(
        "auto (bf16 on GPUs that have it natively, fp16 on other CUDA GPUs, fp32 elsewhere) "
        "| gpu-half (the same) | fp32 | bf16 | fp16 (CUDA)", default="auto")
    compile: bool = _help("torch.compile the model", default=False)
    grad_checkpointing: bool = _help(
        "recompute blocks in the backward pass to save memory", default=False)
    store_attention_probabilities: bool = _help(
        "bf16 on the CPU: keep the attention's T x T probabilities for the backward pass instead "
        "of recomputing them (more memory, slightly faster)", default=False)
    seed: int = _help("random seed (model init, data order, augmentation)", default=0)
    # output
    out: str | None = _help("run directory (None: write nothing)", default=None)
    resume: bool = _help(
        "continue the run in --out from its last checkpoint (a run stopped before its first "
        "checkpoint starts again from step 0, and says so)", default=False)
    checkpoint_every: int = _help(
        "checkpoint every this many steps, at each epoch's end and every --checkpoint-every-min "
        "minutes of training, whichever comes first, and at the end (0: at the end only)",
        default=1000)
    checkpoint_every_min: float = _help(
        "checkpoint after this many minutes of training since the last checkpoint (with "
        "--checkpoint-every; 0: not by time)", default=10.0)
    keep_checkpoints: int = _help("how many checkpoints to keep", default=1)
    eval_every: int = _help(
        "evaluate on the test set (the validation set with --val-size) every this many steps (0: "
        "at the end only)", default=0)
    keep_best: bool = _help(
        "end with the weights of the best validation top-1 seen at the --eval-every points and the"
        " last step (ties: the earliest); the test and few-shot evaluations and the saved model "
        "use them (needs --val-size and --eval-every)", default=False)
    log_every: int = _help("write a metrics line every this many steps", default=10)
    fewshot: tuple[int, ...] = _help(
        "after training, few-shot linear accuracy for these shots", default=())
    quiet: bool = _help("no progress bar and no messages", default=False)
    tensorboard: bool = _help(
        "also write TensorBoard logs (if tensorboard is installed)", default=True)

    def __post_init__(self) -> None:
        self.betas = None if self.betas is None else tuple(self.betas)
        self.fewshot = tuple(self.fewshot)
        check_fields(self, NUMBER_RANGES)  # every option's type and range first
        for name in PATH_OPTIONS:
            value = getattr(self, name)
            if value is not None and not value.strip():
                what = "empty" if not value else "blank"
                raise ConfigError(f"{name}={value!r} is {what}: name a path, or leave {name} out "
                                  "(None) for its default")
        if self.recipe not in RECIPES:
            raise ConfigError(f"unknown recipe {self.recipe!r}; choose one of {', '.join(RECIPES)}")
        for name, choices in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES),
                              ("device", DEVICES), ("precision", PRECISIONS), ("decode", DECODES)):
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise ConfigError(f"{name}={value!r} is not one of {', '.join(choices)}")
        lengths = [n for n in ("epochs", "steps", "time_budget_min")
                   if getattr(self, n) is not None]
        if len(lengths) > 1:
            raise ConfigError("give one of epochs, steps, time_budget_min, not "
                              f"{' and '.join(lengths)}")
        for k in self.fewshot:
            check_number("fewshot", k, int, "> 0")
        if self.classes is not None:
            self.classes = tuple(self.classes)
            for c in self.classes:
                check_number("classes", c, int, ">= 0")
            if not self.classes or len(set(self.classes)) != len(self.classes):
                raise ConfigError(f"classes={self.classes!r}: name each class to keep once (at "
                                  "least one), e.g. 0,1,2,3,4")
        for beta in self.betas or ():
            check_number("betas", beta, float, "in [0, 1)")
        if self.betas is not None:
            self.betas = tuple(float(b) for b in self.betas)
        if self.keep_best and not (self.val_size > 0 and self.eval_every > 0):
            missing = [flag for flag, value in (("--val-size N", self.val_size),
                                                ("--eval-every K", self.eval_every)) if value <= 0]
            raise ConfigError("keep_best picks the best of the evaluations on a validation set "
                              f"during training: give {' and '.join(missing)} (> 0)")
        if self.resume and not self.out:
            raise ConfigError("resume needs the run directory (out)")

    def resolved(self) -> TrainConfig:
        """A copy with every None knob filled from the recipe, except the warm-up: a recipe's
        warm-up depends on the run's length (`recipe_warmup`)."""
        recipe = RECIPES[self.recipe]
        changes = {k: v for k, v in recipe.items() if k != "warmup" and getattr(self, k) is None}
        if self.epochs is None and self.steps is None and self.time_budget_min is None:
            changes["epochs"] = DEFAULT_EPOCHS
        return dataclasses.replace(self, **changes)

    def recipe_warmup(self, total_steps: int | None) -> float:
        """The recipe's warm-up steps, capped at a tenth of the run (time budget: 0.1 of it)."""
        if total_steps is None:
            return 0.1
        return float(min(RECIPES[self.recipe]["warmup"], total_steps // 10))

    def batch_split(self, world_size: int) -> tuple[int, int]:
        """(micro, accum): each of `world_size` processes computes its share of the global batch as
        `accum` micro-batches of `micro` images: the global batch is `batch_size` for any world."""
        micro = self.micro_batch or self.batch_size // world_size
        if micro < 1 or self.batch_size % (world_size * micro):
            raise ConfigError(f"batch_size={self.batch_size} is not a multiple of "
                              f"world_size={world_size} x micro_batch={micro}")
        return micro, self.batch_size // (world_size * micro)
