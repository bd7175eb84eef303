"""A run's images: the splits, the sampler of global batches, the loaders, the evaluation passes.

Image files are decoded in the loader workers, or on the device (the workers read bytes and draw
the crops and flips); an augmentation the device does not apply keeps training on the workers. An
evaluation gives rank r the images r, r + W, ...; a share that fails fails every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler, Subset

from vitzoo import data as datasets
from vitzoo.data.transforms import (EncodedSamples, collate_encoded, decode_batch, device_ops,
                                    holds_files)
from vitzoo.errors import ConfigError
from vitzoo.evaluate import (classification_sums, eval_loader, extract_features,
                             metrics_from_sums)
from vitzoo.train import distributed
from vitzoo.train.config import TrainConfig
from vitzoo.train.distributed import Env

Batches = Callable[[Dataset, Sequence[int]], Iterable]


def check_data(cfg: TrainConfig, env: Env) -> None:
    """A DataError unless the dataset reads; with `download` rank 0 fetches it, the others wait."""
    if cfg.download and env.is_main:
        datasets.check_data(cfg.data, cfg.data_dir, download=True)
    if cfg.download:
        distributed.barrier(env)
    datasets.check_data(cfg.data, cfg.data_dir)


def load_splits(cfg: TrainConfig, base) -> tuple[Dataset, Dataset | None, Dataset,
                                                 datasets.DataInfo]:
    """The raw train, validation (or None) and test splits, cut to their limits, and the facts."""
    def load(split: str) -> Dataset:
        return datasets.load_split(cfg.data, split, cfg.data_dir, img_size=base.img_size,
                                   in_chans=base.in_chans, seed=cfg.seed)

    train_raw, test_raw = load("train"), load("test")
    info = datasets.data_info(cfg.data, train_raw, base.in_chans)
    if cfg.classes is not None:  # before the validation split and the limits: they count these
        train_raw, test_raw = (datasets.keep_classes(s, cfg.classes, cfg.data)
                               for s in (train_raw, test_raw))
        names = info.classes and tuple(info.classes[c] for c in cfg.classes)
        info = dataclasses.replace(info, num_classes=len(cfg.classes), classes=names)
    # held out before train_limit: the training subsets of one seed nest and never validate
    train_raw, val_raw = datasets.split_validation(train_raw, cfg.val_size)
    train_raw = datasets.subset(train_raw, cfg.train_limit, cfg.seed)
    return train_raw, val_raw, datasets.subset(test_raw, cfg.test_limit, cfg.seed), info


def resolve_decode(decode: str, device: torch.device, train_raw: Dataset,
                   data: str = "the dataset") -> str:
    """"workers" or "device": where `decode` decodes this split's images on this device."""
    if decode == "workers":
        return "workers"
    files = holds_files(train_raw)
    if decode == "device" and not files:
        raise ConfigError(f"decode=device decodes image files, and {data} holds none: use "
                          "decode=workers, or auto")
    return "device" if decode == "device" or (device.type == "cuda" and files) else "workers"


class GlobalBatchSampler(Sampler):
    """Micro-batches of keys (epoch, index) for one process: epoch e's permutation, seeded by
    (seed, e), cut into global batches, of which `rank` takes the rank-th of `world_size` shares:
    the global batches do not depend on the world size. `start_step` skips the steps done."""

    def __init__(self, size: int, global_batch: int, micro_batch: int, rank: int, world_size: int,
                 seed: int, epoch: int, start_step: int = 0) -> None:
        self.size, self.global_batch, self.micro_batch = size, global_batch, micro_batch
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.epoch, self.start_step = epoch, start_step
        self.steps = size // global_batch

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.epoch, self.start_step = epoch, start_step

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
    """The splits as the workers read them, the batch mixer, where images are decoded, the
    training loader (made once: its workers stay) and each evaluation pass's batches."""

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
        self.sampler = GlobalBatchSampler(len(self.train_set), cfg.batch_size, micro_batch,
                                          env.rank, env.world_size, cfg.seed, 0)
        self.train_loader = None

    def describe(self) -> str:
        where = f"on {self.device}" if self.train_on_device else "in the loader workers"
        return f"training images decoded {where}"

    def micro_batches(self, start_step: int, steps_per_epoch: int
                      ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(uint8 images, labels) of each micro-batch from `start_step` on, epoch after epoch."""
        if self.train_loader is None:
            dataset, collate, workers = self.train_set, None, self.cfg.num_workers
            if self.train_on_device:  # bytes go to the decoder, which copies them: nothing to pin
                dataset, collate = EncodedSamples(self.train_set, self.train_ops), collate_encoded
            self.train_loader = DataLoader(
                dataset, batch_sampler=self.sampler, num_workers=workers, collate_fn=collate,
                pin_memory=self.device.type == "cuda" and not self.train_on_device,
                persistent_workers=workers > 0, generator=torch.Generator().manual_seed(
                    self.cfg.seed), multiprocessing_context=datasets.worker_start(workers))
        epoch, start = divmod(start_step, steps_per_epoch)
        while True:
            self.sampler.set_epoch(epoch, start)
            for batch in self.train_loader:
                on_device = self.train_on_device
                yield decode_batch(batch, self.train_ops, self.device) if on_device else batch
            epoch, start = epoch + 1, 0

    def eval_batches(self, dataset: Dataset, indices: Sequence[int]) -> Iterable:
        """(uint8 images, labels) of a split's `indices`; the workers end with the pass."""
        size, workers = max(self.micro, 256), self.cfg.num_workers
        if self.eval_ops is None or not isinstance(dataset, datasets.Transformed):
            return eval_loader(dataset, indices, batch_size=size, num_workers=workers,
                               pin_memory=self.device.type == "cuda")
        loader = DataLoader(Subset(EncodedSamples(dataset, self.eval_ops), list(indices)),
                            batch_size=size, num_workers=workers, collate_fn=collate_encoded,
                            multiprocessing_context=datasets.worker_start(workers))
        return (decode_batch(batch, self.eval_ops, self.device) for batch in loader)


def plain_batches(dataset: Dataset, indices: Sequence[int]) -> Iterable:
    return eval_loader(dataset, indices, batch_size=256)


def measure(model: torch.nn.Module, dataset: Dataset, env: Env, dtype: torch.dtype | None = None,
            batches: Batches = plain_batches) -> dict[str, float]:
    """Top-1, top-5 and loss of `model` on `dataset`, each rank a share, the sums all-reduced."""
    loader = batches(dataset, range(env.rank, len(dataset), env.world_size))
    sums = distributed.all_or_none(lambda: classification_sums(model, loader, dtype), env)
    return metrics_from_sums(distributed.all_reduce(sums, env))


def shared_features(model: torch.nn.Module, env: Env, batches: Batches = plain_batches):
    """The few-shot evaluation's `features`: each rank extracts every W-th image; all get all."""

    def features(dataset: Dataset, indices: Sequence[int] | None):
        indices = list(range(len(dataset))) if indices is None else list(indices)
        mine = indices[env.rank :: env.world_size]
        passed = mine or indices[:1]  # a rank with no image passes one, to learn the width
        feats, labels = distributed.all_or_none(
            lambda: extract_features(model, batches(dataset, passed)), env)
        return (distributed.gather_strided(feats[: len(mine)], len(indices), env),
                distributed.gather_strided(labels[: len(mine)], len(indices), env))

    return features
