"""Data for training and evaluation, all read through torchvision, in three steps:

- `sources`: where images come from (fashion-mnist, cifar10/100, oxford-pets, flowers102, an ImageFolder
  tree, its WebDataset shards, synthetic), the dataset's facts (`data_info`) and the splits cut from it
  (`split_validation`, `subset`); every dataset yields `(uint8 image (C, H, W), label)`; `named`: the files
  of the datasets torchvision fetches, `download` (MD5-verified, docs/datasets.md); `sharding`: an
  ImageFolder written as tar shards (`write_shards`, `vitzoo shard`), `shards`: read at random
  (`ShardImages`), `shard_index`: where each sample lies in a shard;
- `augment`: per-sample resizing and augmentation, reproducible from (seed, epoch, index)
  (`Transformed`), and batch-level MixUp / CutMix (`batch_mixer`);
- `normalization`: uint8 batches on the device -> normalised floats with the model's mean and std;
- `decode`: image files' bytes and their decoding (torchvision.io, PIL for the rest); `encoded` and
  `on_device`: loader workers hand over the bytes and each sample's crop and flip, the training device
  decodes a batch and applies them (`--decode device`: the same images as the workers' path);
- `workers`: how a loader starts its worker processes (`worker_start`: not by fork where that can hang).

    from vitzoo import data
    train = data.Transformed(data.load_split("synthetic", "train"), data.build_transform((28, 28), None))
"""

from vitzoo.data.augment import Augment, Transformed, batch_mixer, build_transform
from vitzoo.data.named import download
from vitzoo.data.normalization import Normalizer, normalize
from vitzoo.data.sharding import write_shards
from vitzoo.data.shards import ShardImages
from vitzoo.data.sources import (
    FASHION_FILES,
    STATS,
    SYSTEM_FASHION_MNIST,
    VALIDATION_SEED,
    DataInfo,
    FolderImages,
    KeptClasses,
    SyntheticImages,
    TensorImages,
    cache_dir,
    check_data,
    classes_kept,
    data_info,
    keep_classes,
    load_split,
    split_validation,
    subset,
)
from vitzoo.data.workers import worker_start

__all__ = [
    "FASHION_FILES",
    "STATS",
    "SYSTEM_FASHION_MNIST",
    "VALIDATION_SEED",
    "Augment",
    "DataInfo",
    "FolderImages",
    "Normalizer",
    "ShardImages",
    "SyntheticImages",
    "TensorImages",
    "Transformed",
    "batch_mixer",
    "build_transform",
    "cache_dir",
    "KeptClasses",
    "check_data",
    "classes_kept",
    "data_info",
    "keep_classes",
    "download",
    "load_split",
    "worker_start",
    "write_shards",
    "normalize",
    "split_validation",
    "subset",
]
