"""The Trainer's input pipeline: the splits at the model's resolution, the training loader and its
micro-batches, and the batches of the evaluations, decoded in the loader workers or on the device.

`decode` (TrainConfig) chooses where image files are decoded. `workers`: each loader worker reads,
decodes, augments and resizes its samples (`Transformed`), the training process gets uint8 batches at
the model's size. `device`: the workers read the files' bytes and draw each sample's crop and flip
(vitzoo.data.transforms, the same draws from the same seeds), the training process decodes each
micro-batch on its device and applies them there (vitzoo.data.transforms): one worker, one CPU core,
decodes and augments about 500 ImageNet-sized JPEGs a second (benchmarks/results/loader/), so 8 feed a
GPU about 4,000, where one at 40% of an H100's peak trains ViT-B/16 at 128 px on about 12,000. `auto` is
`device` on CUDA for a dataset of image files, else `workers`. An augmentation the device does not
apply (a padded random crop, RandAugment) keeps training on the workers' path; the evaluations, which
only resize, still decode on the device.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from vitzoo import data as datasets
from vitzoo.data.transforms import EncodedSamples, collate_encoded, decode_batch, device_ops, encoded_view
from vitzoo.errors import ConfigError
from vitzoo.evaluate import eval_loader
from vitzoo.train.config import TrainConfig
from vitzoo.train.distributed import Env
from vitzoo.train.sampler import GlobalBatchSampler


def resolve_decode(decode: str, device: torch.device, train_raw: Dataset, data: str = "the dataset") -> str:
    """"workers" or "device": `decode` ("auto", "workers", "device") for this device and training split."""
    if decode == "workers":
        return "workers"
    files = encoded_view(train_raw) is not None
    if decode == "device" and not files:
        raise ConfigError(f"decode=device decodes image files on the device, but {data} is not read from image files "
                          "(its images are held decoded): use decode=workers, or auto")
    return "device" if decode == "device" or (device.type == "cuda" and files) else "workers"


class Inputs:
    """The splits (`train_set`, `train_eval_set`, `val_set`, `test_set`: `Transformed`, as the workers'
    path reads them), the batch mixer, and where they are decoded (`decode`, `train_on_device`)."""

    def __init__(self, cfg: TrainConfig, env: Env, img_size: tuple[int, int], splits: tuple, num_classes: int,
                 micro_batch: int) -> None:
        train_raw, val_raw, test_raw = splits
        self.cfg, self.env, self.device, self.micro = cfg, env, env.device, micro_batch
        augment = datasets.Augment(cfg.random_resized_crop, cfg.crop_padding, cfg.hflip, cfg.randaugment, cfg.mixup,
                                   cfg.cutmix)
        plain = datasets.build_transform(img_size, None)
        self.train_set = datasets.Transformed(train_raw, datasets.build_transform(img_size, augment), cfg.seed)
        self.train_eval_set = datasets.Transformed(train_raw, plain)
        self.test_set = datasets.Transformed(test_raw, plain)
        self.val_set = datasets.Transformed(val_raw, plain) if val_raw is not None else None
        self.mixer = datasets.batch_mixer(augment, num_classes)
        self.decode = resolve_decode(cfg.decode, self.device, train_raw, cfg.data)
        self.eval_ops = device_ops(plain) if self.decode == "device" else None
        self.train_ops = device_ops(self.train_set.transform) if self.decode == "device" else None
        self.train_on_device = self.train_ops is not None

    def describe(self) -> str:
        """Where the images are decoded, in words (the Trainer says it at the start)."""
        if self.decode == "workers":
            return "images decoded in the loader workers"
        if self.train_on_device:
            return f"image files decoded on {self.device} (the loader workers read bytes)"
        return (f"training images decoded in the loader workers (its augmentation is not one {self.device} applies), "
                f"evaluation images on {self.device}")

    # ------------------------------------------------------------------------ training
    def make_loader(self) -> None:
        """The training loader, made once: its workers are kept between epochs and evaluations."""
        cfg, env = self.cfg, self.env
        self.sampler = GlobalBatchSampler(len(self.train_set), cfg.batch_size, self.micro, env.rank, env.world_size,
                                          cfg.seed, 0)
        dataset, collate, pin = self.train_set, None, self.device.type == "cuda"
        if self.train_on_device:  # bytes go to the decoder, which copies them itself: nothing to pin
            dataset, collate, pin = EncodedSamples(self.train_set, self.train_ops), collate_encoded, False
        self.train_loader = DataLoader(dataset, batch_sampler=self.sampler, num_workers=cfg.num_workers, pin_memory=pin,
                                       collate_fn=collate, persistent_workers=cfg.num_workers > 0,
                                       generator=torch.Generator().manual_seed(cfg.seed),
                                       multiprocessing_context=datasets.worker_start(cfg.num_workers))

    def micro_batches(self, start_step: int, steps_per_epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(uint8 images, labels) of each micro-batch from `start_step` on, epoch after epoch; the images
        on the device when it decodes them, else on the host (pinned on CUDA)."""
        epoch, start = divmod(start_step, steps_per_epoch)
        while True:
            self.sampler.set_epoch(epoch, start)
            for batch in self.train_loader:
                yield decode_batch(batch, self.train_ops, self.device) if self.train_on_device else batch
            epoch, start = epoch + 1, 0

    # ------------------------------------------------------------------------ evaluation
    def eval_batches(self, dataset: Dataset, indices: Sequence[int], batch_size: int) -> Iterable:
        """(uint8 images, labels) of `indices` of `dataset` (one of the plain splits) in order, for one
        evaluation pass: its workers end with it."""
        cfg = self.cfg
        pin = self.device.type == "cuda"
        if self.eval_ops is None or not isinstance(dataset, datasets.Transformed):
            return eval_loader(dataset, indices, batch_size=batch_size, num_workers=cfg.num_workers, pin_memory=pin)
        encoded = Subset(EncodedSamples(dataset, self.eval_ops), list(indices))
        loader = DataLoader(encoded, batch_size=batch_size, shuffle=False, num_workers=cfg.num_workers,
                            collate_fn=collate_encoded, multiprocessing_context=datasets.worker_start(cfg.num_workers))
        return (decode_batch(batch, self.eval_ops, self.device) for batch in loader)


__all__ = ["Inputs", "resolve_decode"]
