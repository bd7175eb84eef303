"""The model a state dict (in vitzoo's names) describes, for loading weights without a model name.

Shapes give embed_dim, depth, mlp_dim, patch size, the hybrid's ResNet stages and width, the grid and
so the image size, the pooling and the head. The number of attention heads is not in the shapes:
it comes from the checkpoint when it says (transformers' config.json), else the paper's rule
D / 64 (Table 1: 768 -> 12, 1024 -> 16; Ti and S deviate: 192 -> 3, 384 -> 6 as the official
configs), unless the caller passes `num_heads`.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from vitzoo.config import ViTConfig, merge_options
from vitzoo.errors import CheckpointError
from vitzoo.weights.converted import ConvertedWeights

# the official configs' heads where D / 64 is not the answer
_HEADS = {192: 3, 384: 6, 1280: 16}
_STAGE_UNIT = re.compile(r"^stem\.backbone\.stages\.(\d+)\.(\d+)\.conv1\.weight$")
_BLOCK = re.compile(r"^encoder\.blocks\.(\d+)\.")


def default_heads(embed_dim: int) -> int:
    heads = _HEADS.get(embed_dim, max(1, embed_dim // 64))
    return heads if embed_dim % heads == 0 else 1


def _mlp_dim(sd, depth: int) -> int:
    """The MLP size most of the blocks' MLP tensors give (fc1's rows and bias, fc2's columns): one
    mis-shaped tensor then stands out as the one that does not fit, instead of every other being blamed."""
    sizes = [int(t.shape[axis]) for i in range(depth)
             for name, axis in (("fc1.weight", 0), ("fc1.bias", 0), ("fc2.weight", 1))
             if (t := sd.get(f"encoder.blocks.{i}.mlp.{name}")) is not None and t.ndim > axis]
    if not sizes:
        raise CheckpointError("cannot infer the model from these weights: no 'encoder.blocks.0.mlp.fc1.weight'")
    return Counter(sizes).most_common(1)[0][0]


def infer_options(checkpoint: ConvertedWeights) -> dict[str, Any]:
    """ViTConfig options for the weights of `checkpoint` (vitzoo names)."""
    sd = checkpoint.state_dict
    if "stem.proj.weight" not in sd:
        raise CheckpointError("cannot infer the model from these weights: no patch projection 'stem.proj.weight'")
    proj = sd["stem.proj.weight"]
    embed_dim, _, patch_h, patch_w = proj.shape
    if patch_h != patch_w:
        raise CheckpointError(f"non-square patches {patch_h}x{patch_w} are not supported")
    options: dict[str, Any] = {"embed_dim": int(embed_dim), "patch_size": int(patch_h)}
    depth = 1 + max((int(m.group(1)) for k in sd if (m := _BLOCK.match(k))), default=-1)
    options["depth"] = depth
    if depth:
        options["mlp_dim"] = _mlp_dim(sd, depth)
    stride = int(patch_h)
    if "stem.backbone.conv_root.weight" in sd:
        units: dict[int, int] = {}
        for key in sd:
            if m := _STAGE_UNIT.match(key):
                stage, unit = int(m.group(1)), int(m.group(2))
                units[stage] = max(units.get(stage, 0), unit + 1)
        layers = tuple(units[s] for s in sorted(units))
        root = int(sd["stem.backbone.conv_root.weight"].shape[0])
        options.update(stem="resnet", stem_options={"layers": layers, "width": max(1, root // 64)},
                       in_chans=int(sd["stem.backbone.conv_root.weight"].shape[1]))
        stride *= 4 * 2 ** max(len(layers) - 1, 0)
    else:
        options["in_chans"] = int(proj.shape[1])
    options["num_heads"] = default_heads(int(embed_dim))
    options["pool"] = "token" if "cls_token" in sd else "gap"
    if "fc_norm.weight" in sd:  # the final LayerNorm after the pooling (timm's fc_norm)
        options["fc_norm"] = True
    if "encoder.pos_embed.weight" not in sd:
        options["pos_embed"] = "none"
    if checkpoint.grid is not None:
        options["img_size"] = (checkpoint.grid[0] * stride, checkpoint.grid[1] * stride)
    if "head.pre_logits.weight" in sd:
        options.update(head="mlp", head_options={"representation_size": int(sd["head.pre_logits.weight"].shape[0])})
    else:
        options.update(head="linear", head_options={})
    options["num_classes"] = int(sd["head.fc.weight"].shape[0]) if "head.fc.weight" in sd else 0
    if options["in_chans"] != 3:
        options.update(mean=(0.5,) * options["in_chans"], std=(0.5,) * options["in_chans"])
    return merge_options(options, checkpoint.config)  # what the converter read (numerics, heads, ...) wins


def infer_config(checkpoint: ConvertedWeights, overrides: dict[str, Any] | None = None, hints: dict[str, Any] | None = None) -> ViTConfig:
    """The config of the model these weights belong to; `hints` (e.g. img_size and mean/std from the
    source's metadata) and then `overrides` (the caller's options) change it."""
    inferred = ViTConfig(**infer_options(checkpoint))
    return inferred.replace(**{**(hints or {}), **(overrides or {})})
