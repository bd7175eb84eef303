"""The extension points of vitzoo (plugins/README.md): one hook per kind of component, named
models, tags and weight formats. Each returns a dict from names to classes (to instances for weight
formats). A component is an ``nn.Module`` built from the `ViTConfig`; it may declare its options as
an ``Options`` dataclass and a classmethod ``check(config)`` raising `ConfigError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from torch import nn

    from vitzoo.config import ViTConfig
    from vitzoo.weights import WeightFormat
    from vitzoo.zoo import PretrainedTag

hookspec = pluggy.HookspecMarker("vitzoo")
hookimpl = pluggy.HookimplMarker("vitzoo")


@hookspec
def vitzoo_stems() -> dict[str, type[nn.Module]]:
    """Stems, x_p E of eq. (1): ``Stem(config)`` with ``stride: (sh, sw)``, the pixels per token,
    and ``forward(x[B, C, H, W]) -> [B, (H / sh) * (W / sw), D]``, tokens in row-major order."""


@hookspec
def vitzoo_pos_embeds() -> dict[str, type[nn.Module]]:
    """Position embeddings, E_pos of eq. (1): ``PosEmbed(config, grid, num_prefix_tokens)`` with
    ``modes``, the injection modes it supports among "input", "every_layer", "every_layer_shared";
    ``resample(grid)``, adapting its parameters in place; and ``in_attention``. False:
    ``forward(x[B, T, D], grid) -> [B, T, D]`` adds it, for any grid (the first
    ``num_prefix_tokens`` tokens have no grid position). True: one per block, ``forward(q[B, heads,
    Q, head_dim], grid) -> [B or 1, heads, Q, T]`` is a bias of the attention logits, one row per
    query given (the last block gives only the pool's ``tokens_read``)."""


@hookspec
def vitzoo_pools() -> dict[str, type[nn.Module]]:
    """Pools, y of eq. (4): ``Pool(config)`` with ``num_prefix_tokens`` (class tokens to prepend,
    0 or 1) and ``forward(x[B, T, D]) -> [B, D]``; optional ``tokens_read``: it reads the first so
    many tokens only, and the last block computes those alone."""


@hookspec
def vitzoo_heads() -> dict[str, type[nn.Module]]:
    """Heads: ``Head(config)`` with ``num_features`` and ``forward(x[B, D], pre_logits=False) ->
    [B, num_classes]`` (the pre-logits features when asked or with num_classes 0); the classifier
    starts at zero, as the official one."""


@hookspec
def vitzoo_models() -> dict[str, ViTConfig]:
    """Named models: name -> the complete `ViTConfig` that `vitzoo.create(name)` builds."""


@hookspec
def vitzoo_pretrained_tags() -> dict[str, PretrainedTag]:
    """Released weights: "MODEL.TAG" -> a `vitzoo.zoo.PretrainedTag` of that ``name``, its
    ``model`` registered, its ``format`` registered and that of the files in ``hub_id``, which fit
    the model with the tag's options; ``accuracy`` only with its ``accuracy_source``; at most one
    ``default=True`` per model."""


@hookspec
def vitzoo_weight_formats() -> dict[str, WeightFormat]:
    """Weight formats: name -> a `vitzoo.weights.WeightFormat` of that ``name``, with
    ``recognises(keys, metadata)`` (no two formats recognise the same weights), ``convert(
    state_dict, metadata) -> ConvertedWeights`` (vitzoo's names, the options the weights decide,
    the token grid), ``hints(metadata)`` (options the weights cannot decide) and
    ``labels(metadata)`` (class names, or None); ``metadata`` maps the JSON files beside the
    weights to their content."""
