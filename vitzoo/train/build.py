"""What a run is built from, by its TrainConfig: the data splits, the model, its precision, the
input pipeline and the evaluations.

Each is a function of the config (and the dataset's facts, the model or the device), so that a test
or a script builds what a run would without running it. `decode` chooses where image files are
decoded: `workers` (each loader worker decodes, augments and resizes) or `device` (the workers read
bytes and draw the crops and flips; the training process decodes and applies them on its device,
vitzoo.data.transforms); `auto` is `device` on CUDA for image files. An
augmentation the device does not apply keeps training on the workers' path. Evaluations score each
process a share of the images (rank r: r, r + W, ...), and a share that fails fails every rank.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

import vitzoo
from vitzoo import data as datasets
from vitzoo import precision
from vitzoo.data.transforms import (EncodedSamples, collate_encoded, decode_batch, device_ops,
                                    encoded_view)
from vitzoo.errors import ConfigError
from vitzoo.evaluate import (classification_sums, eval_loader, extract_features,
                             fewshot_linear_accuracy, metrics_from_sums)
from vitzoo.registry import shape_differences
from vitzoo.train import distributed
from vitzoo.train.config import TrainConfig
from vitzoo.train.distributed import Env
from vitzoo.weights.layout import HUB_PREFIX


# ---------------------------------------------------------------------------- the model
def pretrained_kind(source: str) -> str:
    """What `--pretrained` names: "directory" (save_pretrained's), "file" (weights), "hub"
    (hf-hub:ORG/NAME[@REV]) or "tag" (MODEL.TAG[@REV]); an error otherwise."""
    if os.path.isdir(source):
        return "directory"
    if os.path.isfile(source):
        return "file"
    if source.startswith(HUB_PREFIX):
        return "hub"
    if source.split("@")[0] in vitzoo.list_pretrained():
        return "tag"
    raise FileNotFoundError(f"--pretrained {source}: no such file or directory, and no pretrained "
                            "tag of that name (MODEL.TAG: `vitzoo list --pretrained`; a Hub repo: "
                            f"{HUB_PREFIX}ORG/NAME)")


def resolve_model(cfg: TrainConfig) -> vitzoo.Resolved:
    """The model a run trains, worked out once: the named model with the user's options, or the
    weights `--pretrained` names with them; nothing is built yet."""
    options = {k: v for k, v in cfg.model_options.items() if k != "num_classes"}  # the data's
    kind = pretrained_kind(cfg.pretrained) if cfg.pretrained else None
    if kind in ("directory", "hub"):
        resolved = vitzoo.resolve_source(cfg.pretrained, **options)
        if kind == "directory" and cfg.model in vitzoo.list_models():  # the name: only a label
            differ = shape_differences(resolved.config, vitzoo.get_config(cfg.model, **options))
            if differ:
                warnings.warn(f"--pretrained {cfg.pretrained} holds another model than "
                              f"{cfg.model}: {', '.join(differ)}; training the saved model",
                              stacklevel=2)
        return resolved
    if kind == "tag":
        return vitzoo.resolve(cfg.pretrained, pretrained=True, **options)
    return vitzoo.resolve(cfg.model, pretrained=cfg.pretrained or None, **options)


def dataset_config(cfg: TrainConfig, info: datasets.DataInfo,
                   resolved: vitzoo.Resolved) -> vitzoo.ViTConfig:
    """The resolved config with the dataset's classes; a model trained from scratch also takes the
    dataset's channels and normalisation unless the user set them."""
    given, base = cfg.model_options, resolved.config
    if given.get("num_classes", info.num_classes) != info.num_classes:
        raise ConfigError(f"num_classes={given['num_classes']} but {cfg.data} has "
                          f"{info.num_classes} classes")
    changes: dict[str, Any] = {"num_classes": info.num_classes}
    if not cfg.pretrained:
        in_chans = given.get("in_chans", info.in_chans)
        changes["in_chans"] = in_chans
        for key in ("mean", "std"):
            value = getattr(info, key)
            value = tuple(value) * in_chans if len(value) == 1 else tuple(value)
            changes[key] = given.get(key, value)
    return base.replace(**changes)


def build_model(cfg: TrainConfig, resolved: vitzoo.Resolved, config: vitzoo.ViTConfig,
                labels: tuple[str, ...] | None = None) -> vitzoo.VisionTransformer:
    """`resolved` built with `config`; `labels`, the dataset's class names, saved with it."""
    model = resolved.build(config)
    if cfg.reset_head:
        model.reset_classifier(config.num_classes, head="linear")  # zero-initialised
    if cfg.grad_checkpointing:
        model.set_grad_checkpointing(True)
    if labels is not None:
        model.labels = list(labels)
    return model


def has_running_statistics(model: torch.nn.Module) -> bool:
    """Whether training changes buffers (BatchNorm's statistics) that DDP must broadcast; vitzoo's
    own buffers are constant."""
    return any(getattr(m, "running_mean", None) is not None for m in model.modules())


def distribute(model: torch.nn.Module, compile: bool, env: Env) -> torch.nn.Module:
    """What the loop calls: `model` in DDP across processes, compiled as asked (`model` itself is
    evaluated and saved). On CUDA, matrix products in TF32."""
    device = env.device
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    wrapped = model
    if env.distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=device_ids, broadcast_buffers=has_running_statistics(model))
    return torch.compile(wrapped) if compile else wrapped


def resumed_precision(saved: str | None, resolved: torch.dtype | None, device: torch.device,
                      say=lambda message: None) -> torch.dtype | None:
    """The precision a resumed run computes in: the one its checkpoint was written in (`saved`),
    whatever this device would choose now (`resolved`), so that its numbers do not change mid-run;
    fp16 where CUDA is missing cannot go on."""
    if saved is None or precision.FIXED[saved] == resolved:
        return resolved
    if saved == "fp16" and device.type != "cuda":
        raise ConfigError(f"the checkpoint was trained in fp16, which needs CUDA, and this run "
                          f"is on {device}: resume it on a GPU, or start a new run")
    emulated = (saved == "bf16" and device.type == "cuda"
                and precision.gpu_half(device) != torch.bfloat16)
    say(f"resuming in {saved}, the precision the checkpoint was trained in, not "
        f"{precision.flag(resolved)}, which {device} would choose"
        + (" (emulated on this GPU: slower)" if emulated else ""))
    return precision.FIXED[saved]


# ---------------------------------------------------------------------------- the data
def check_data(cfg: TrainConfig, env: Env) -> None:
    """A DataError unless the dataset can be read, before any work. With `download` the first
    process fetches what is missing while the others wait, then all check it."""
    if cfg.download and env.is_main:
        datasets.check_data(cfg.data, cfg.data_dir, download=True)
    if cfg.download:
        distributed.barrier(env)
    datasets.check_data(cfg.data, cfg.data_dir)


def load_splits(cfg: TrainConfig, base: vitzoo.ViTConfig
                ) -> tuple[Dataset, Dataset | None, Dataset, datasets.DataInfo]:
    """The raw train, validation (or None) and test splits, cut to their limits, and the info."""
    def load(split: str) -> Dataset:
        return datasets.load_split(cfg.data, split, cfg.data_dir, img_size=base.img_size,
                                   in_chans=base.in_chans, seed=cfg.seed)

    train_raw, test_raw = load("train"), load("test")
    info = datasets.data_info(cfg.data, train_raw, base.in_chans)
    if cfg.classes is not None:  # before the validation split and the limits: they count these
        train_raw, test_raw = (datasets.keep_classes(s, cfg.classes, cfg.data)
                               for s in (train_raw, test_raw))
        info = datasets.classes_kept(info, cfg.classes)
    left = len(train_raw) - cfg.val_size
    if cfg.val_size and left < cfg.batch_size:
        raise ConfigError(f"val_size={cfg.val_size} leaves {max(0, left)} of the {len(train_raw)} "
                          f"training images, fewer than one batch ({cfg.batch_size}); lower "
                          "--val-size or --batch-size")
    # held out before train_limit: the training subsets of one seed are nested and never validate
    train_raw, val_raw = datasets.split_validation(train_raw, cfg.val_size)
    train_raw = datasets.subset(train_raw, cfg.train_limit, cfg.seed)
    if val_raw is not None and cfg.train_limit and cfg.train_limit > len(train_raw):
        warnings.warn(f"train_limit={cfg.train_limit} is more than the {len(train_raw)} training "
                      f"images left beside the validation split (val_size={cfg.val_size}): "
                      f"training on all {len(train_raw)}", stacklevel=3)
    return train_raw, val_raw, datasets.subset(test_raw, cfg.test_limit, cfg.seed), info


def resolve_decode(decode: str, device: torch.device, train_raw: Dataset,
                   data: str = "the dataset") -> str:
    """"workers" or "device": `decode` ("auto", "workers", "device") for this device and split."""
    if decode == "workers":
        return "workers"
    files = encoded_view(train_raw) is not None
    if decode == "device" and not files:
        raise ConfigError(f"decode=device decodes image files on the device, but {data} is not "
                          "read from image files (its images are held decoded): use "
                          "decode=workers, or auto")
    return "device" if decode == "device" or (device.type == "cuda" and files) else "workers"


class GlobalBatchSampler(Sampler):
    """Micro-batches of keys (epoch, index) for one process. Epoch e's order is a permutation
    seeded by (seed, e), cut into global batches (the last incomplete one dropped); process `rank`
    takes the rank-th of `world_size` contiguous shares of each, in micro-batches. The global
    batches do not depend on the world size; `start_step` skips the steps already done."""

    def __init__(self, size: int, global_batch: int, micro_batch: int, rank: int, world_size: int,
                 seed: int, epoch: int, start_step: int = 0) -> None:
        self.size, self.global_batch, self.micro_batch = size, global_batch, micro_batch
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch, self.start_step = epoch, start_step
        self.steps = size // global_batch

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Continue with this epoch's order from `start_step` (one loader serves every epoch)."""
        self.epoch, self.start_step = epoch, start_step

    def __len__(self) -> int:
        return (self.steps - self.start_step) * (self.global_batch // self.world_size
                                                 // self.micro_batch)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(self.size, generator=g).tolist()
        share = self.global_batch // self.world_size
        for step in range(self.start_step, self.steps):
            start = step * self.global_batch + self.rank * share
            mine = order[start : start + share]
            for i in range(0, share, self.micro_batch):
                yield [(self.epoch, index) for index in mine[i : i + self.micro_batch]]


class Inputs:
    """The splits (`train_set`, `train_eval_set`, `val_set`, `test_set`, as the workers' path
    reads them), the batch mixer, and where they are decoded (`decode`, `train_on_device`)."""

    def __init__(self, cfg: TrainConfig, env: Env, img_size: tuple[int, int], splits: tuple,
                 num_classes: int, micro_batch: int) -> None:
        train_raw, val_raw, test_raw = splits
        self.cfg, self.env, self.device, self.micro = cfg, env, env.device, micro_batch
        augment = datasets.Augment(cfg.random_resized_crop, cfg.crop_padding, cfg.hflip,
                                   cfg.randaugment, cfg.mixup, cfg.cutmix)
        plain = datasets.build_transform(img_size, None)
        train_transform = datasets.build_transform(img_size, augment)
        self.train_set = datasets.Transformed(train_raw, train_transform, cfg.seed)
        self.train_eval_set = datasets.Transformed(train_raw, plain)
        self.test_set = datasets.Transformed(test_raw, plain)
        self.val_set = datasets.Transformed(val_raw, plain) if val_raw is not None else None
        self.mixer = datasets.batch_mixer(augment, num_classes)
        self.decode = resolve_decode(cfg.decode, self.device, train_raw, cfg.data)
        on_device = self.decode == "device"
        self.eval_ops = device_ops(plain) if on_device else None
        self.train_ops = device_ops(self.train_set.transform) if on_device else None
        self.train_on_device = self.train_ops is not None

    def describe(self) -> str:
        """Where the images are decoded, in words (the Trainer says it at the start)."""
        if self.decode == "workers":
            return "images decoded in the loader workers"
        if self.train_on_device:
            return f"image files decoded on {self.device} (the loader workers read bytes)"
        return (f"training images decoded in the loader workers (its augmentation is not one "
                f"{self.device} applies), evaluation images on {self.device}")

    def make_loader(self) -> None:
        """The training loader, made once: its workers are kept between epochs and evaluations."""
        cfg, env = self.cfg, self.env
        self.sampler = GlobalBatchSampler(len(self.train_set), cfg.batch_size, self.micro,
                                          env.rank, env.world_size, cfg.seed, 0)
        dataset, collate, pin = self.train_set, None, self.device.type == "cuda"
        if self.train_on_device:  # bytes go to the decoder, which copies them: nothing to pin
            dataset, collate = EncodedSamples(self.train_set, self.train_ops), collate_encoded
            pin = False
        workers = cfg.num_workers
        self.train_loader = DataLoader(dataset, batch_sampler=self.sampler, num_workers=workers,
                                       pin_memory=pin, collate_fn=collate,
                                       persistent_workers=workers > 0,
                                       generator=torch.Generator().manual_seed(cfg.seed),
                                       multiprocessing_context=datasets.worker_start(workers))

    def micro_batches(self, start_step: int, steps_per_epoch: int
                      ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(uint8 images, labels) of each micro-batch from `start_step` on, epoch after epoch."""
        epoch, start = divmod(start_step, steps_per_epoch)
        while True:
            self.sampler.set_epoch(epoch, start)
            for batch in self.train_loader:
                on_device = self.train_on_device
                yield decode_batch(batch, self.train_ops, self.device) if on_device else batch
            epoch, start = epoch + 1, 0

    def eval_batches(self, dataset: Dataset, indices: Sequence[int], batch_size: int) -> Iterable:
        """(uint8 images, labels) of `indices` of a plain split, in order, for one evaluation pass:
        its workers end with it."""
        workers, pin = self.cfg.num_workers, self.device.type == "cuda"
        if self.eval_ops is None or not isinstance(dataset, datasets.Transformed):
            return eval_loader(dataset, indices, batch_size=batch_size, num_workers=workers,
                               pin_memory=pin)
        encoded = Subset(EncodedSamples(dataset, self.eval_ops), list(indices))
        loader = DataLoader(encoded, batch_size=batch_size, shuffle=False, num_workers=workers,
                            collate_fn=collate_encoded,
                            multiprocessing_context=datasets.worker_start(workers))
        return (decode_batch(batch, self.eval_ops, self.device) for batch in loader)


# ---------------------------------------------------------------------------- evaluations
class Evaluation:
    """`model` (the plain module) measured in batches of `batch_size` under autocast to
    `autocast_dtype`; `batches(dataset, indices, batch_size)` makes each pass's batches where
    given (`Inputs.eval_batches`), else a loader of `num_workers` workers does."""

    def __init__(self, model: torch.nn.Module, env: Env, *, batch_size: int, num_workers: int,
                 pin_memory: bool, autocast_dtype: torch.dtype | None,
                 batches: Callable[[Dataset, Sequence[int], int], Iterable] | None = None) -> None:
        self.model, self.env, self.autocast_dtype = model, env, autocast_dtype
        self.batch_size, self.num_workers, self.pin_memory = batch_size, num_workers, pin_memory
        self.batches = batches

    def loader(self, dataset: Dataset, indices: Sequence[int]) -> Iterable:
        if self.batches is not None:
            return self.batches(dataset, indices, self.batch_size)
        return eval_loader(dataset, indices, batch_size=self.batch_size,
                           num_workers=self.num_workers, pin_memory=self.pin_memory)

    def measure(self, dataset: Dataset) -> dict[str, float]:
        """Top-1, top-5 and loss on `dataset`, each rank a share, the sums all-reduced."""
        loader = self.loader(dataset, range(self.env.rank, len(dataset), self.env.world_size))
        sums = distributed.all_or_none(lambda: classification_sums(
            self.model, dataset, autocast_dtype=self.autocast_dtype, loader=loader), self.env)
        return metrics_from_sums(distributed.all_reduce(sums, self.env))

    def fewshot(self, train_set: Dataset, test_set: Dataset, shots: Iterable[int],
                seed: int) -> dict:
        """The few-shot linear accuracy for each of `shots`, over 5 draws of the training images."""
        return fewshot_linear_accuracy(self.model, train_set, test_set, shots, draws=5, seed=seed,
                                       features=self.features)

    def features(self, dataset: Dataset,
                 indices: Sequence[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Features of `indices` (None: all): each rank extracts every world_size-th image, every
        rank gets all of them, in order."""
        env = self.env
        indices = list(range(len(dataset))) if indices is None else list(indices)
        mine = indices[env.rank :: env.world_size]
        passed = mine or indices[:1]  # a rank with no image passes one, to learn the width
        features, labels = distributed.all_or_none(lambda: extract_features(
            self.model, dataset, passed, loader=self.loader(dataset, passed)), env)
        features, labels = features[: len(mine)], labels[: len(mine)]
        return (distributed.gather_strided(features, len(indices), env),
                distributed.gather_strided(labels, len(indices), env))
