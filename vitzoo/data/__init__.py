"""Data for training and evaluation: every dataset yields `(uint8 image (C, H, W), label)`.

- `folders`: where images come from (the named datasets, an image folder, its shards, synthetic
  images), the dataset's facts (`data_info`) and the splits cut from it; `named`: the datasets
  torchvision fetches (`download`);
- `shards`: WebDataset tar shards read at random; `sharding`: a folder written as shards;
- `transforms`: decoding, augmentation, normalisation, and the decoding on the training device;
- `workers`: how a loader starts its worker processes.

    from vitzoo import data
    raw = data.load_split("synthetic", "train")
    train = data.Transformed(raw, data.build_transform((28, 28), None))
"""

from vitzoo.data.folders import (
    FASHION_FILES,
    STATS,
    SYSTEM_FASHION_MNIST,
    VALIDATION_SEED,
    DataInfo,
    FileImages,
    FolderImages,
    KeptClasses,
    SyntheticImages,
    TensorImages,
    check_data,
    classes_kept,
    data_info,
    keep_classes,
    load_split,
    split_validation,
    subset,
)
from vitzoo.data.named import download
from vitzoo.data.sharding import write_shards
from vitzoo.data.shards import ShardImages
from vitzoo.data.transforms import (
    Augment,
    Normalizer,
    Transformed,
    batch_mixer,
    build_transform,
    normalize,
)
from vitzoo.data.workers import worker_start
