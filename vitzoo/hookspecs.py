"""The extension points of vitzoo: one hook per kind of component, and one for weight formats.

A plugin is a module or object with functions named like the hooks below, decorated with
`vitzoo.hookimpl`; the built-ins are registered so (`vitzoo/builtins.py`), third-party packages
through the entry-point group ``vitzoo`` (``[project.entry-points.vitzoo]`` in pyproject.toml).
Each hook maps names to component classes (format objects for weight formats); a component is an
``nn.Module`` built from the `ViTConfig`, honouring its hook's docstring. A class may declare an
``Options`` dataclass (a `vitzoo.options.Options`: ``KIND`` names it in errors, ``__post_init__``
checks it, ``SHAPE`` the fields that make another architecture); the config's ``stem_options``,
``pos_embed_options``, ``pool_options`` or ``head_options`` hold their values, set on the command
line as ``--PART.OPTION``. Two plugins returning one name are an error naming both; so is a
hookimpl named like no hook.
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
    """Stems: how an image becomes a sequence of D-dimensional tokens (the x_p E of eq. 1).

    Contract of a stem class ``Stem(config: ViTConfig)``:
    - ``stride: tuple[int, int]``: pixels of input per token, (height, width); an image size must
      be divisible by it.
    - ``forward(x: Tensor[B, C, H, W]) -> Tensor[B, N, D]`` with N = (H / stride_h) *
      (W / stride_w), tokens in row-major order of the grid.
    - optional classmethod ``check(config)`` raising `ConfigError` for options it cannot honour.
    """


@hookspec
def vitzoo_pos_embeds() -> dict[str, type[nn.Module]]:
    """Position embeddings: how tokens learn where they are (E_pos of eq. 1, or its variants).

    Contract of ``PosEmbed(config: ViTConfig, grid: tuple[int, int], num_prefix_tokens: int)``:
    - ``modes: tuple[str, ...]``: the injection modes it supports among "input", "every_layer",
      "every_layer_shared" (the paper's Table 8 leaves the others undefined).
    - ``in_attention: bool``. False: ``forward(x: Tensor[B, T, D], grid) -> Tensor[B, T, D]``
      returns the tokens with position information added; the first ``num_prefix_tokens`` tokens
      (the class token) have no grid position. True: one instance is built per encoder block and
      ``forward(q: Tensor[B, heads, Q, head_dim], grid) -> Tensor[B or 1, heads, Q, T]`` returns a
      bias added to that block's attention logits. The queries are those of the first Q tokens:
      Q = T, except in the last block when the pool reads only the class token (``tokens_read``).
    - ``resample(grid)``: adapt the parameters in place to a new token grid. ``forward`` with
      another grid must work too (for `dynamic_img_size`), without changing parameters.
    - optional classmethod ``check(config)`` raising `ConfigError`.
    """


@hookspec
def vitzoo_pools() -> dict[str, type[nn.Module]]:
    """Pooling: how the normed token sequence becomes one vector per image (y of eq. 4).

    Contract of ``Pool(config: ViTConfig)``: ``num_prefix_tokens: int`` (how many class tokens the
    model must prepend, 0 or 1) and ``forward(x: Tensor[B, T, D]) -> Tensor[B, D]``. Optional
    ``tokens_read: int``: the pool reads only the first ``tokens_read`` tokens, and the model's
    forward then passes it ``x: Tensor[B, tokens_read, D]``, computing the last block for those
    tokens alone.
    """


@hookspec
def vitzoo_heads() -> dict[str, type[nn.Module]]:
    """Heads: the classifier on the pooled representation.

    Contract of ``Head(config: ViTConfig)``: ``num_features: int`` (size of the pre-logits output)
    and ``forward(x: Tensor[B, D], pre_logits: bool = False) -> Tensor[B, num_classes]`` (or the
    pre-logits features when asked, or when ``config.num_classes == 0``). The classifier weights
    start at zero, as in the official code.
    """


@hookspec
def vitzoo_models() -> dict[str, ViTConfig]:
    """Named models: name -> the complete `ViTConfig` that `vitzoo.create(name)` builds."""


@hookspec
def vitzoo_pretrained_tags() -> dict[str, PretrainedTag]:
    """Pretrained tags: released weights of a named model, "MODEL.TAG" -> a
    `vitzoo.zoo.PretrainedTag` whose ``name`` is that key.

    Contract: ``model`` is a registered model and ``format`` a registered weight format, the format
    of the files in the Hub repo ``hub_id``; those weights fit the model's config with the tag's
    options (``config_options()``) and need that preprocessing; ``accuracy`` is only given with
    the ``accuracy_source`` that reports it. At most one tag per model has ``default=True`` (a
    model's only tag is its default anyway).
    """


@hookspec
def vitzoo_weight_formats() -> dict[str, WeightFormat]:
    """Weight formats: the checkpoint layouts `vitzoo.create(..., pretrained=...)` and
    `vitzoo.from_pretrained` read (vitzoo's own, timm, torchvision, transformers, official .npz).

    Contract of a format, an instance of a `vitzoo.weights.WeightFormat` subclass whose
    ``name`` is its key here:
    - ``recognises(keys, metadata) -> bool``: whether the tensor names are this format's;
      ``metadata`` maps the JSON files beside the weights (config.json, preprocessor_config.json)
      to their content. By default: all of the class's ``marks`` (tensor names) are among the
      keys. No two formats may recognise the same weights.
    - ``convert(state_dict, metadata) -> ConvertedWeights``: vitzoo's names, the options the
      weights decide (act, norm_eps, pool, head, num_classes, ...) and the position embedding's
      token grid.
    - ``hints(metadata) -> dict``: options for an inferred config that the weights cannot decide
      (img_size, mean, std, crop_pct, interpolation); ``{}`` by default.
    - ``labels(metadata) -> list[str] | None``: the class names of the head, in class order, when
      the metadata has them; None by default.
    """
