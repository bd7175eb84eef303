"""The names of the files a model directory or Hub repo holds, the Hub prefix, the token grid."""

from __future__ import annotations

import math

from vitzoo.errors import CheckpointError

HUB_PREFIX = "hf-hub:"  # a source hf-hub:ORG/NAME[@REVISION]
CONFIG_NAME = "config.json"  # vitzoo's, transformers' or timm's model config
WEIGHTS_NAME = "model.safetensors"
CARD_NAME = "README.md"
PREPROCESSOR_NAME = "preprocessor_config.json"  # transformers' image normalisation
WEIGHT_FILES = (WEIGHTS_NAME, "pytorch_model.bin")  # looked for in this order
METADATA_FILES = (CONFIG_NAME, PREPROCESSOR_NAME)  # the JSON read beside the weights
HUB_FILES = (*METADATA_FILES, CARD_NAME)  # what a download fetches besides the weights


def square_side(num_patches: int) -> int | None:
    side = math.isqrt(num_patches)
    return side if side * side == num_patches else None


def square_grid(num_patches: int, fmt: str) -> tuple[int, int]:
    """The grid of a foreign position embedding: square, as those formats keep no grid shape."""
    side = square_side(num_patches)
    if side is None:
        raise CheckpointError(f"{fmt} position embedding has {num_patches} patch positions, not a "
                              "square grid")
    return (side, side)
