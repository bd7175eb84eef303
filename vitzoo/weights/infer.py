"""The model a state dict (in vitzoo's names) describes, for loading weights without a model name.

Shapes give embed_dim, depth, mlp_dim, patch size, the hybrid's ResNet stages and width, the grid
and so the image size, the position embedding, the pooling and the head. The number of attention
heads is not in a fused q, k, v projection's shapes: it comes from the checkpoint when it says (an
official .npz, transformers' config.json, a relative position table), else from the caller
(`num_heads`). Weights of one of the paper's widths (Table 1's D and MLP size) take that size's
count, said in a warning; any other width is refused, since a wrong count loads without error and
only changes the outputs. A bare vitzoo state dict keeps no config: what its names and shapes cannot
say is assumed, said in a warning.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections import Counter
from typing import Any

from vitzoo.config import ViTConfig, merge_options
from vitzoo.errors import CheckpointError, ConfigError
from vitzoo.weights.converted import ConvertedWeights
from vitzoo.weights.vitzoo_format import FORMAT as VITZOO_FORMAT
from vitzoo.zoo import SIZES

# the paper's model sizes by the widths of their weights, (embed_dim, mlp_dim) -> (name, heads): a
# size's Transformer at any depth (the hybrids', and the few-layer models of tests and ablations)
PAPER_WIDTHS = {(s["embed_dim"], s["mlp_dim"]): (f"ViT-{size.title()}",
                                                 s["num_heads"]) for size, s in SIZES.items()}
# what a bare vitzoo state dict cannot say about itself and changes its outputs (its numerics, and
# where its position information goes)
UNSTATED = ("act", "norm_eps", "pos_embed", "pos_embed_mode")
_STAGE_UNIT = re.compile(r"^stem\.backbone\.stages\.(\d+)\.(\d+)\.conv1\.weight$")
_BLOCK = re.compile(r"^encoder\.blocks\.(\d+)\.")
_RELATIVE = re.compile(r"^encoder\.blocks\.\d+\.attn\.relative\.table$")


def _position(sd) -> dict[str, Any]:
    """The position embedding its tensors' names give (vitzoo's names: each kind's parameters are
    its own), and the number of heads a relative table's shape (offsets, heads, head_dim) gives."""
    tables = [sd[k] for k in sd if _RELATIVE.match(k)]
    if tables:
        return {"pos_embed": "relative", "pos_embed_mode": "input",
                **({"num_heads": int(tables[0].shape[1])} if tables[0].ndim == 3 else {})}
    per_layer = any(k.startswith("encoder.pos_embed.0.") for k in sd)  # one embedding per block
    two_d = any(k.startswith("encoder.pos_embed.") and k.endswith(".row") for k in sd)
    if per_layer or two_d or "encoder.pos_embed.weight" in sd:
        return {"pos_embed": "learned_2d" if two_d else "learned_1d",
                **({"pos_embed_mode": "every_layer"} if per_layer else {})}
    return {"pos_embed": "none"}


def _mlp_dim(sd, depth: int) -> int:
    """The MLP size most of the blocks' MLP tensors give (fc1's rows and bias, fc2's columns): one
    mis-shaped tensor then stands out as the one that does not fit, not every other one."""
    sizes = [int(t.shape[axis]) for i in range(depth)
             for name, axis in (("fc1.weight", 0), ("fc1.bias", 0), ("fc2.weight", 1))
             if (t := sd.get(f"encoder.blocks.{i}.mlp.{name}")) is not None and t.ndim > axis]
    if not sizes:
        raise CheckpointError("cannot infer the model from these weights: no "
                              "'encoder.blocks.0.mlp.fc1.weight'")
    return Counter(sizes).most_common(1)[0][0]


def infer_options(checkpoint: ConvertedWeights) -> dict[str, Any]:
    """ViTConfig options for the weights of `checkpoint` (vitzoo names)."""
    sd = checkpoint.state_dict
    if "stem.proj.weight" not in sd:
        raise CheckpointError("cannot infer the model from these weights: no patch projection "
                              "'stem.proj.weight'")
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
    options["pool"] = "token" if "cls_token" in sd else "gap"
    if "fc_norm.weight" in sd:  # the final LayerNorm after the pooling (timm's fc_norm)
        options["fc_norm"] = True
    options.update(_position(sd))
    if checkpoint.grid is not None:
        options["img_size"] = (checkpoint.grid[0] * stride, checkpoint.grid[1] * stride)
    if "head.pre_logits.weight" in sd:
        width = int(sd["head.pre_logits.weight"].shape[0])
        options.update(head="mlp", head_options={"representation_size": width})
    else:
        options.update(head="linear", head_options={})
    options["num_classes"] = int(sd["head.fc.weight"].shape[0]) if "head.fc.weight" in sd else 0
    if options["in_chans"] != 3:
        options.update(mean=(0.5,) * options["in_chans"], std=(0.5,) * options["in_chans"])
    return merge_options(options, checkpoint.config)  # what the converter read wins


def infer_config(checkpoint: ConvertedWeights, overrides: dict[str, Any] | None = None,
                 hints: dict[str, Any] | None = None, location: str = "these weights") -> ViTConfig:
    """The config of the model these weights belong to; `hints` (e.g. img_size and mean/std from the
    source's metadata) and then `overrides` (the caller's options) change it. A ConfigError when the
    number of heads is neither stated, given nor one of the paper's models'; a warning naming every
    option assumed (`location` names the weights in both)."""
    options = infer_options(checkpoint)
    given = {**(hints or {}), **(overrides or {})}
    if "num_heads" in given:  # before the config: the assumed count may not divide embed_dim
        options["num_heads"] = given["num_heads"]
    elif "num_heads" not in options:
        options["num_heads"] = assumed_heads(options, checkpoint.format, location)
    if checkpoint.format == VITZOO_FORMAT:
        # no grid: no size either
        unstated = UNSTATED + (("img_size",) if "img_size" not in options else ())
        assumed = [k for k in unstated if k not in given and not _stated_by_names(k, options)]
        if assumed:
            defaults = {f.name: f.default for f in dataclasses.fields(ViTConfig)}
            values = ", ".join(f"{k}={options.get(k, defaults[k])!r}" for k in assumed)
            warnings.warn(f"{location} is a bare vitzoo state dict (no config.json beside it): its "
                          f"names and shapes do not say {', '.join(assumed)}; assumed: {values}. A "
                          "wrong one loads without error and changes the outputs: pass the model's "
                          "own as options, or keep the config.json that save_pretrained writes "
                          "beside the weights", stacklevel=4)
    inferred = ViTConfig(**options)
    return inferred.replace(**given)


def _stated_by_names(option: str, options: dict[str, Any]) -> bool:
    """Whether the tensors' names decided `option`: a learned embedding is seen, and so is a
    relative one or one per block; no embedding tensors may be a parameter-free one (sincos_2d)."""
    learned = options.get("pos_embed") in ("learned_1d", "learned_2d", "relative")
    if option == "pos_embed":
        return learned
    if option == "pos_embed_mode":  # at the input and shared by every layer hold the same tensors
        return (options.get("pos_embed") == "relative"
                or options.get("pos_embed_mode") == "every_layer")
    return False


def assumed_heads(options: dict[str, Any], fmt: str, location: str) -> int:
    """The number of heads for weights that do not state it: that of the paper's model size of the
    same widths, said in a warning; a ConfigError for any other widths, asking for `num_heads`."""
    widths = (options["embed_dim"], options.get("mlp_dim"))
    dims = f"D={widths[0]}, MLP size {widths[1]}"
    how = "pass num_heads=N (vitzoo convert --num-heads N)"
    if widths in PAPER_WIDTHS:
        name, heads = PAPER_WIDTHS[widths]
        warnings.warn(f"{location}: {fmt} weights do not store their number of attention heads; "
                      f"num_heads={heads} is assumed, as {name} has ({dims}). If they were trained "
                      f"with another, {how}: a wrong count loads without error and changes the "
                      "outputs", stacklevel=5)
        return heads
    divisors = [h for h in range(1, widths[0] + 1) if widths[0] % h == 0]
    more = " ..." if len(divisors) > 12 else ""
    raise ConfigError(f"{fmt} weights do not store their number of attention heads, and their "
                      f"widths ({dims}) are not those of one of the paper's models; a wrong count "
                      f"loads without error and changes the outputs, so none is guessed: {how}, "
                      f"the count they were trained with (a divisor of {widths[0]}: "
                      f"{', '.join(map(str, divisors[:12]))}{more})")
