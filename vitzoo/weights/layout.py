"""Where things are: the names of the files a model directory or Hub repo holds, the Hub prefix of a
source, and the square token grid of a position embedding. Every reader and writer uses these.
"""

from __future__ import annotations

import math

from vitzoo.errors import CheckpointError

HUB_PREFIX = "hf-hub:"  # a source `hf-hub:ORG/NAME[@REVISION]`

CONFIG_NAME = "config.json"  # vitzoo's, transformers' or timm's model config
WEIGHTS_NAME = "model.safetensors"  # the weights save_pretrained writes
CARD_NAME = "README.md"  # the model card
PREPROCESSOR_NAME = "preprocessor_config.json"  # transformers' image normalisation

# weight files looked for in a directory or Hub repo, in order of preference
WEIGHT_FILES = (WEIGHTS_NAME, "pytorch_model.bin")
# the JSON files read beside the weights (a format may take options from them)
METADATA_FILES = (CONFIG_NAME, PREPROCESSOR_NAME)
# what a Hub download fetches besides the weights: the metadata and the model card
HUB_FILES = (*METADATA_FILES, CARD_NAME)
# what save_pretrained writes, and so what a saved directory and a pushed repo hold
SAVED_FILES = (WEIGHTS_NAME, CARD_NAME, CONFIG_NAME)


def square_side(num_patches: int) -> int | None:
    """The side of a square grid of `num_patches` tokens, or None when it is not square."""
    side = math.isqrt(num_patches)
    return side if side * side == num_patches else None


def square_grid(num_patches: int, fmt: str) -> tuple[int, int]:
    """The grid of a `fmt` position embedding with `num_patches` patch positions: the foreign
    formats keep no grid shape, only square grids, so any other count is a damaged checkpoint."""
    side = square_side(num_patches)
    if side is None:
        raise CheckpointError(f"{fmt} position embedding has {num_patches} patch positions, not a "
                              "square grid")
    return (side, side)
