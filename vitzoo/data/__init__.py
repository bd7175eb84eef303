"""Data for training and evaluation: every dataset yields `(uint8 image (C, H, W), label)`.

`folders`: where images come from (named datasets, image folders, synthetic) and the splits cut
from them; `named`: the datasets torchvision fetches (`download`); `shards`: WebDataset tar shards
read at random, `sharding` writes them; `transforms`: decoding, augmentation, normalisation, and
decoding on the training device; `workers`: how a loader starts its worker processes.

    from vitzoo import data
    raw = data.load_split("synthetic", "train")
    train = data.Transformed(raw, data.build_transform((28, 28), None))
"""

from vitzoo.data.folders import (FASHION_FILES, SYSTEM_FASHION_MNIST, DataInfo, FileImages,
                                 FolderImages, TensorImages, check_data, classes_kept, data_info,
                                 keep_classes, load_split, split_validation, subset)
from vitzoo.data.named import download
from vitzoo.data.sharding import write_shards
from vitzoo.data.shards import ShardImages
from vitzoo.data.transforms import (Augment, Normalizer, Transformed, batch_mixer, build_transform,
                                    normalize)
from vitzoo.data.workers import worker_start
