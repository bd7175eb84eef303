"""Data for training and evaluation: every dataset yields `(uint8 image (C, H, W), label)`.

`folders`: datasets and the splits cut from them; `named`: torchvision's (`download`); `shards`:
WebDataset tar shards, `sharding` writes them; `transforms`: decoding, augmentation, normalisation
(on the device too); `workers`: how a loader starts its worker processes.

    from vitzoo import data
    raw = data.load_split("synthetic", "train")
    train = data.Transformed(raw, data.build_transform((28, 28), None))
"""

from vitzoo.data.folders import (DataInfo, FileImages, FolderImages, TensorImages, check_data,
                                 data_info, keep_classes, load_split, split_validation, subset)
from vitzoo.data.named import download
from vitzoo.data.sharding import write_shards
from vitzoo.data.shards import ShardImages
from vitzoo.data.transforms import Augment, Normalizer, Transformed, batch_mixer, build_transform
from vitzoo.data.workers import worker_start
