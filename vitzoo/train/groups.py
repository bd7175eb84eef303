"""The optimizer's parameter groups: weight decay on matrices only, and layer-wise learning-rate decay.

Weight decay skips biases, norms, the class token and position embeddings (`no_weight_decay`).

Layer-wise decay (BEiT's, as fine-tuning recipes use it; `--layer-decay R`) gives each parameter a
depth: the embedding (class token, stem, position embedding: the model's `group_matcher` "stem") 0,
block i i + 1, the final norm that of the last block, the head and anything after the encoder the top.
A parameter at depth d learns at R ** (top - d) times the scheduled rate. These are the groups, scales
and weight decays timm's `create_optimizer_v2(model, layer_decay=R)` makes of a vitzoo model; each
group's scale is its "lr_scale", which the loop (and timm's schedulers) multiply into the rate.
"""

from __future__ import annotations

import re
from typing import Any

import torch


def layer_ids(model: torch.nn.Module) -> dict[str, int]:
    """Each trainable parameter's depth, by name (see the module's docstring)."""
    matcher = model.group_matcher(coarse=True)
    stem, block = re.compile(matcher["stem"]), re.compile(matcher["blocks"])
    depth = len(model.encoder.blocks)
    ids = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if stem.match(name):
            ids[name] = 0
        elif found := block.match(name):
            ids[name] = int(found.group(1)) + 1
        elif name.startswith("encoder.norm"):
            ids[name] = depth  # with the last block, as timm groups it
        else:
            ids[name] = depth + 1
    return ids


def parameter_groups(model: torch.nn.Module, weight_decay: float, layer_decay: float | None = None) -> list[dict[str, Any]]:
    """The optimizer's groups: without `layer_decay`, matrices (weight decay) and the rest (none), at the
    scheduled rate; with it, one group per depth and decay, each with its "lr_scale" (the top depth's 1)."""
    skip = model.no_weight_decay()

    def decays(name: str, p: torch.nn.Parameter) -> bool:
        return p.ndim > 1 and name not in skip

    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if layer_decay is None:
        return [{"params": [p for n, p in trainable if decays(n, p)], "weight_decay": weight_decay},
                {"params": [p for n, p in trainable if not decays(n, p)], "weight_decay": 0.0}]
    ids = layer_ids(model)
    top = max(ids.values())
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, p in trainable:
        key = (ids[name], decays(name, p))
        group = groups.setdefault(key, {"params": [], "weight_decay": weight_decay if key[1] else 0.0,
                                        "lr_scale": layer_decay ** (top - key[0])})
        group["params"].append(p)
    return list(groups.values())


__all__ = ["layer_ids", "parameter_groups"]
