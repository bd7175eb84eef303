"""The names of the files a model directory or Hub repo holds, the Hub prefix, the token grid of
a position embedding, and the PyTorch layout of a classifier head."""

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
        raise CheckpointError(f"the {fmt} position embedding's {num_patches} patch positions make "
                              "no square grid: not a ViT of the paper's form")
    return (side, side)


def take_head(params: dict, out: dict, config: dict, pre_logits: str, classifier: str) -> None:
    """A PyTorch-layout head (optional pre-logits Dense + tanh, then the classifier) moved to
    vitzoo's names, and the options it decides: head, representation_size, num_classes."""
    config.update(head="linear", head_options={}, num_classes=0)
    if f"{pre_logits}.weight" in params:
        out["head.pre_logits.weight"] = weight = params.pop(f"{pre_logits}.weight")
        out["head.pre_logits.bias"] = params.pop(f"{pre_logits}.bias")
        config.update(head="mlp", head_options={"representation_size": int(weight.shape[0])})
    if f"{classifier}.weight" in params:
        out["head.fc.weight"] = weight = params.pop(f"{classifier}.weight")
        out["head.fc.bias"] = params.pop(f"{classifier}.bias")
        config["num_classes"] = int(weight.shape[0])
