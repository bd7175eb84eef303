"""The model a state dict in vitzoo's names describes, from its names and shapes. The heads are
not in a fused q, k, v: the weights state them or the caller does; at one of the paper's widths
they are that size's, said in a warning; any other width is refused, since a wrong count loads
and only changes the outputs."""

from __future__ import annotations

import re
import warnings
from collections import Counter
from typing import Any

from vitzoo.errors import CheckpointError
from vitzoo.weights import ConvertedWeights
from vitzoo.zoo import SIZES

# (embed_dim, mlp_dim) -> the paper's size of those widths and its heads, at any depth
PAPER_WIDTHS = {(s["embed_dim"], s["mlp_dim"]): (f"ViT-{size.title()}", s["num_heads"])
                for size, s in SIZES.items()}
# what a bare vitzoo state dict does not say about itself, and what is assumed
UNSTATED = {"act": "gelu", "norm_eps": 1e-6, "pos_embed": "none", "pos_embed_mode": "input",
            "img_size": (224, 224)}


def infer_options(checkpoint: ConvertedWeights) -> dict[str, Any]:
    """The options the weights' names and shapes give, then those their format decided."""
    sd = checkpoint.state_dict
    if getattr(sd.get("stem.proj.weight"), "ndim", 0) != 4:
        raise CheckpointError("cannot infer the model: no patch projection 'stem.proj.weight'")
    embed_dim, in_chans, patch, patch_w = map(int, sd["stem.proj.weight"].shape)
    if patch != patch_w:
        raise CheckpointError(f"non-square patches {patch}x{patch_w} are not supported")
    blocks = [int(m.group(1)) for k in sd if (m := re.match(r"encoder\.blocks\.(\d+)\.", k))]
    depth = 1 + max(blocks, default=-1)
    # the MLP size most tensors give: one mis-shaped tensor then stands out to the strict loader
    sizes = Counter(int(t.shape[axis]) for i in range(depth)
                    for name, axis in (("fc1.weight", 0), ("fc1.bias", 0), ("fc2.weight", 1))
                    if getattr(t := sd.get(f"encoder.blocks.{i}.mlp.{name}"), "ndim", 0) > axis)
    tables = [v for k, v in sd.items() if k.endswith(".attn.relative.table")]
    per_layer = any(k.startswith("encoder.pos_embed.0.") for k in sd)
    two_d = any(k.startswith("encoder.pos_embed.") and k.endswith(".row") for k in sd)
    options: dict[str, Any] = {"embed_dim": embed_dim, "patch_size": patch, "depth": depth,
                               "in_chans": in_chans, "pool": "gap"}
    if "cls_token" in sd:
        options["pool"] = "token"
    if "fc_norm.weight" in sd:  # the LayerNorm after the pooling
        options["fc_norm"] = True
    if sizes:
        options["mlp_dim"] = sizes.most_common(1)[0][0]
    if tables:  # (offsets, heads, head_dim): it gives the heads too
        options.update(pos_embed="relative", pos_embed_mode="input",
                       **({"num_heads": int(tables[0].shape[1])} if tables[0].ndim == 3 else {}))
    elif per_layer or two_d or "encoder.pos_embed.weight" in sd:
        options.update(pos_embed="learned_2d" if two_d else "learned_1d",
                       **({"pos_embed_mode": "every_layer"} if per_layer else {}))
    stride = patch
    if (root := sd.get("stem.backbone.conv_root.weight")) is not None:
        units: dict[int, int] = {}
        for key in sd:
            if m := re.match(r"stem\.backbone\.stages\.(\d+)\.(\d+)\.conv1\.weight$", key):
                units[int(m[1])] = max(units.get(int(m[1]), 0), int(m[2]) + 1)
        layers = tuple(units[s] for s in sorted(units))
        options.update(stem="resnet", in_chans=int(root.shape[1]),
                       stem_options={"layers": layers, "width": max(1, root.shape[0] // 64)})
        stride *= 4 * 2 ** max(len(layers) - 1, 0)
    if checkpoint.grid is not None:
        options["img_size"] = (checkpoint.grid[0] * stride, checkpoint.grid[1] * stride)
    width = sd["head.pre_logits.weight"].shape[0] if "head.pre_logits.weight" in sd else None
    options.update(head="mlp" if width else "linear",
                   head_options={"representation_size": int(width)} if width else {},
                   num_classes=int(sd["head.fc.weight"].shape[0]) if "head.fc.weight" in sd else 0)
    if options["in_chans"] != 3:
        options.update(mean=(0.5,) * options["in_chans"], std=(0.5,) * options["in_chans"])
    for key, value in checkpoint.config.items():  # what the format read wins, parts' merged
        options[key] = {**options.get(key, {}), **value} if isinstance(value, dict) else value
    return options


def infer(checkpoint: ConvertedWeights, given: dict[str, Any], location: str) -> dict[str, Any]:
    """The options of the model the weights belong to, `given` ones over them; the heads asked
    for or assumed, and what a bare vitzoo state dict leaves unsaid assumed and said."""
    options = {**infer_options(checkpoint), **given}
    if "num_heads" not in options:
        options["num_heads"] = assumed_heads(options, checkpoint.format, location)
    assumed = {k: v for k, v in UNSTATED.items() if k not in options}
    if assumed and checkpoint.format == "vitzoo":  # a foreign format decides its numerics
        warnings.warn(f"{location} is a bare vitzoo state dict: its names and shapes do not say "
                      f"{', '.join(assumed)}; assumed: "
                      f"{', '.join(f'{k}={v!r}' for k, v in assumed.items())}. A wrong one "
                      "changes the outputs: pass them, or keep the config.json save_pretrained "
                      "writes", stacklevel=5)
    return {**options, **assumed}


def assumed_heads(options: dict[str, Any], fmt: str, location: str) -> int:
    """The heads of the paper's size of these widths, said in a warning; else refused."""
    widths = (options["embed_dim"], options.get("mlp_dim"))
    dims, fix = f"D={widths[0]}, MLP size {widths[1]}", "pass num_heads=N (--num-heads N)"
    if widths not in PAPER_WIDTHS:
        raise CheckpointError(f"{fmt} weights do not store their number of attention heads and "
                              f"their widths ({dims}) are none of the paper's: {fix}")
    name, heads = PAPER_WIDTHS[widths]
    warnings.warn(f"{location}: {fmt} weights do not store their number of attention heads; "
                  f"num_heads={heads} is assumed, as {name} has ({dims}). If wrong, {fix}",
                  stacklevel=6)
    return heads
