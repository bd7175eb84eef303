"""The extension points of vitzoo: one hook per kind of component, and one for weight formats.

A plugin is any module or object with functions named like the hooks below, decorated with
`vitzoo.hookimpl`. The built-in components are registered exactly so (`vitzoo/builtins.py`), and
third-party packages are found through the entry-point group ``vitzoo``::

    # pyproject.toml of a plugin package
    [project.entry-points.vitzoo]
    vitzoo-sincos = "vitzoo_sincos"

Each hook returns a mapping from component name to a component class (to a format object for
weight formats). A component class is an
``nn.Module`` whose constructor takes the typed `ViTConfig` (plus, for position embeddings, the
token grid); the contract each kind must honour is in the hook's docstring.

Every component class may declare options of its own, as the built-in ResNet stem and MLP head do:

- optional ``Options``: a dataclass deriving `vitzoo.options.Options` (its ``KIND`` names it in
  errors, e.g. "stem 'convstem'"; ``__post_init__`` checks the values; ``SHAPE`` the fields that make
  another architecture, all by default). The config's dict for the part (``stem_options``,
  ``pos_embed_options``, ``pool_options``, ``head_options``) holds their values: checked by
  ``Options.from_dict`` (unknown names fail with a "did you mean"), written out with their defaults
  when the config is resolved, saved in config.json and set on the command line as
  ``--PART.OPTION`` (``--stem.extra-layers 1``). The component reads them in its constructor with
  ``Options.from_dict(config.stem_options)``. A component without ``Options`` takes none. Two plugins that return
the same name are an error naming both; so is a hookimpl whose name is none of the hooks below (a
misspelling pluggy would otherwise ignore), an error naming the plugin and the hook it meant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from torch import nn

    from vitzoo.config import ViTConfig
    from vitzoo.tags import PretrainedTag
    from vitzoo.weights.formats import WeightFormat

hookspec = pluggy.HookspecMarker("vitzoo")
hookimpl = pluggy.HookimplMarker("vitzoo")


@hookspec
def vitzoo_stems() -> dict[str, type[nn.Module]]:
    """Stems: how an image becomes a sequence of D-dimensional tokens (the x_p E of eq. 1).

    Contract of a stem class ``Stem(config: ViTConfig)``:
    - ``stride: tuple[int, int]``: pixels of input per token, (height, width); an image size must be
      divisible by it.
    - ``forward(x: Tensor[B, C, H, W]) -> Tensor[B, N, D]`` with N = (H / stride_h) * (W / stride_w),
      tokens in row-major order of the grid.
    - optional classmethod ``check(config)`` raising `ConfigError` for options it cannot honour.
    """


@hookspec
def vitzoo_pos_embeds() -> dict[str, type[nn.Module]]:
    """Position embeddings: how tokens learn where they are (E_pos of eq. 1, or its variants).

    Contract of a class ``PosEmbed(config: ViTConfig, grid: tuple[int, int], num_prefix_tokens: int)``:
    - ``modes: tuple[str, ...]``: the injection modes it supports among "input", "every_layer",
      "every_layer_shared" (the paper's Table 8 leaves the others undefined).
    - ``in_attention: bool``. False: ``forward(x: Tensor[B, T, D], grid) -> Tensor[B, T, D]`` returns
      the tokens with position information added; the first ``num_prefix_tokens`` tokens (the class
      token) have no grid position. True: one instance is built per encoder block and
      ``forward(q: Tensor[B, heads, Q, head_dim], grid) -> Tensor[B or 1, heads, Q, T]`` returns a bias
      added to that block's attention logits. The queries are those of the first Q tokens: Q = T,
      except in the last block when the pool reads only the class token (``tokens_read``).
    - ``resample(grid)``: adapt the parameters in place to a new token grid. ``forward`` with a grid
      other than the current one must work too (for `dynamic_img_size`), without changing parameters.
    - optional classmethod ``check(config)`` raising `ConfigError`.
    """


@hookspec
def vitzoo_pools() -> dict[str, type[nn.Module]]:
    """Pooling: how the normed token sequence becomes one vector per image (y of eq. 4).

    Contract of ``Pool(config: ViTConfig)``: ``num_prefix_tokens: int`` (how many class tokens the
    model must prepend, 0 or 1) and ``forward(x: Tensor[B, T, D]) -> Tensor[B, D]``. Optional
    ``tokens_read: int``: the pool reads only the first ``tokens_read`` tokens, and the model's forward
    then passes it ``x: Tensor[B, tokens_read, D]``, computing the last block for those tokens alone.
    """


@hookspec
def vitzoo_heads() -> dict[str, type[nn.Module]]:
    """Heads: the classifier on the pooled representation.

    Contract of ``Head(config: ViTConfig)``: ``num_features: int`` (size of the pre-logits output) and
    ``forward(x: Tensor[B, D], pre_logits: bool = False) -> Tensor[B, num_classes]`` (or the
    pre-logits features when asked, or when ``config.num_classes == 0``). The classifier weights start
    at zero, as in the official code.
    """


@hookspec
def vitzoo_models() -> dict[str, ViTConfig]:
    """Named models: name -> the complete `ViTConfig` that `vitzoo.create(name)` builds."""


@hookspec
def vitzoo_pretrained_tags() -> dict[str, PretrainedTag]:
    """Pretrained tags: released weights of a named model, "MODEL.TAG" -> a `vitzoo.tags.PretrainedTag`
    whose ``name`` is that key (`vitzoo.create("MODEL.TAG", pretrained=True)` loads them).

    Contract: ``model`` is a registered model and ``format`` a registered weight format, the format of
    the files in the Hub repo ``hub_id``; those weights fit the model's config with the tag's options
    (``config_options()``: img_size, num_classes, mean, std, crop_pct, interpolation, ``options``)
    and need that preprocessing; ``accuracy`` is only given with the ``accuracy_source`` that reports
    it. At most one tag per model has ``default=True`` (a model's only tag is its default anyway).
    """


@hookspec
def vitzoo_weight_formats() -> dict[str, WeightFormat]:
    """Weight formats: the checkpoint layouts `vitzoo.create(..., pretrained=...)` and
    `vitzoo.from_pretrained` read (vitzoo's own, timm, torchvision, transformers, official .npz).

    Contract of a format, an instance of a `vitzoo.weights.formats.WeightFormat` subclass whose
    ``name`` is its key here:
    - ``recognises(keys, metadata) -> bool``: whether the tensor names are this format's; ``metadata``
      maps the JSON files beside the weights (config.json, preprocessor_config.json) to their content.
      By default: all of the class's ``marks`` (tensor names) are among the keys. No two formats may
      recognise the same weights.
    - ``convert(state_dict, metadata) -> ConvertedWeights``: vitzoo's names, the options the weights decide
      (act, norm_eps, pool, head, num_classes, ...) and the token grid of the position embedding.
    - ``hints(metadata) -> dict``: options for an inferred config that the weights cannot decide
      (img_size, mean, std, crop_pct, interpolation); ``{}`` by default.
    - ``labels(metadata) -> list[str] | None``: the class names of the head, in class order, when the
      metadata has them; None by default.
    """
