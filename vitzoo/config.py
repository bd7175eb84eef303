"""ViTConfig: the single source of truth for one model.

The options every model shares are fields here, with the names of the paper (`embed_dim` is D,
`depth` is L, `mlp_dim` is the MLP size, `patch_size` is P). The four parts a model is built from
(stem, position embedding, pooling, head) are named by a field each, and each part's own settings
are a dict beside it (`stem_options`, ...): the part declares them (its `Options` dataclass) and
checks them, so a plugin adds options without touching this module. Components receive this
dataclass, never loose keyword arguments. Checks that need the registry (is `stem="foo"` a known
component? are its options its own?) happen when a config is resolved
(`vitzoo.registry.resolve_config`); everything else is checked here, on construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vitzoo.errors import ConfigError
from vitzoo.options import Options, check_fields, check_number, closest, described

# The parts a model is built from: the field naming each, and the field holding its own options.
PART_OPTIONS = {"stem": "stem_options", "pos_embed": "pos_embed_options", "pool": "pool_options",
                "head": "head_options"}


def _json_form(value: Any) -> Any:
    """Tuples as lists, recursively: options compare equal written in code or read from JSON."""
    if isinstance(value, (tuple, list)):
        return [_json_form(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_form(v) for k, v in value.items()}
    return value


# timm's names for options vitzoo spells otherwise, where they mean the same (`from_timm_names`)
TIMM_SYNONYMS = {"drop_rate": "dropout", "attn_drop_rate": "attn_dropout",
                 "drop_path_rate": "drop_path"}
POOLS_OF_TIMM = {"token": "token", "avg": "gap"}  # timm's global_pool -> vitzoo's pool


def from_timm_names(options: dict) -> dict:
    """`options` with timm's names of vitzoo's options translated: drop_rate, attn_drop_rate,
    drop_path_rate, global_pool ("token", "avg") and class_token (False: global average pooling)."""
    options = {TIMM_SYNONYMS.get(k, k): v for k, v in options.items()}
    if "global_pool" in options:
        pool = options.pop("global_pool")
        if pool not in POOLS_OF_TIMM:
            raise ConfigError(f"global_pool={pool!r}: vitzoo pools with the class token (timm's "
                              f"'token') or the average of all tokens ('avg', vitzoo's pool='gap')")
        options.setdefault("pool", POOLS_OF_TIMM[pool])
    if "class_token" in options:
        if options.pop("class_token") is False and options.setdefault("pool", "gap") == "token":
            raise ConfigError("class_token=False with pool='token': pooling the class token needs "
                              "one")
    return options


def merge_options(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` updated with `changes`, a part's options dict option by option (not replaced)."""
    merged = {**base, **changes}
    for key in PART_OPTIONS.values():
        if isinstance(base.get(key), dict) and isinstance(changes.get(key), dict):
            merged[key] = {**base[key], **changes[key]}
    return merged


# how an image is resized to the model's input (torchvision's InterpolationMode names)
INTERPOLATIONS = ("bicubic", "bilinear", "nearest")
# `act`: the MLP's nonlinearity, exact GELU or the official Flax code's tanh approximation (their
# functions: vitzoo.layers.activations.ACTIVATIONS)
ACTIVATIONS = ("gelu", "gelu_tanh")
# what timm's ports of the hybrids need for the same logits (the timm format, the zoo's tags): the
# weight standardisation and GroupNorm eps of timm's ResNetV2 (vitzoo.layers.resnet.NUMERICS)
HYBRID_NUMERICS = {"stem_options": {"numerics": "timm"}}


def _pair(value, option: str) -> tuple[int, int]:
    if isinstance(value, bool):
        raise ConfigError(f"{option} must be an int or a (height, width) pair, got {value!r}")
    if isinstance(value, int):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return (int(value[0]), int(value[1]))
    raise ConfigError(f"{option} must be an int or a (height, width) pair of ints, got {value!r}")


def _per_channel(values, option: str, in_chans: int) -> tuple[float, ...]:
    """mean/std as floats; one value for every channel (e.g. the default (0.5, 0.5, 0.5)) applies to
    any number of channels, so that `in_chans=1` alone works. Per-channel values must match in_chans
    (checked in `_check`)."""
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        values = (values,)
    try:
        values = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(f"{option} must be a number or a sequence of numbers, "
                          f"got {values!r}") from None
    if len(values) != in_chans and values and len(set(values)) == 1:
        values = values[:1] * in_chans
    return values


@dataclass
class ViTConfig(Options):
    """Every option of a Vision Transformer, with the defaults of ViT-B/16 at 224 px."""

    KIND = "model"  # in errors: "unknown model option ..."
    OTHER_NAMES = {  # names of no option here (timm's, a part's own): what to give instead
        "resnet_layers": "It is the ResNet stem's: stem_options={'layers': ...}",
        "resnet_width": "It is the ResNet stem's: stem_options={'width': ...}",
        "resnet_numerics": "It is the ResNet stem's: stem_options={'numerics': ...}",
        "representation_size": "It is the MLP head's: head_options={'representation_size': ...}",
        "mlp_ratio": "vitzoo takes mlp_dim, the MLP's width (timm's mlp_ratio times embed_dim)",
        "qkv_bias": "vitzoo's attention always has q, k and v biases, as the paper's",
        "no_embed_class": "vitzoo adds the position embedding to the class token too, as the paper "
                          "does",
        "reg_tokens": "register tokens are not part of the paper's ViT",
    }

    # input
    img_size: tuple[int, int] = (224, 224)
    in_chans: int = 3
    num_classes: int = 1000
    # stem: how the image becomes a sequence of tokens (eq. 1)
    stem: str = "patch"
    stem_options: dict = field(default_factory=dict)  # e.g. the hybrid's ResNet: layers, width
    patch_size: int = 16  # on the image for `patch`, on the ResNet feature map for `resnet`
    # the Transformer encoder (eq. 2-4)
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    # position information
    pos_embed: str = "learned_1d"
    pos_embed_options: dict = field(default_factory=dict)
    # where the model adds it (Appendix D.4): "input", "every_layer", "every_layer_shared"; the
    # encoder implements each mode, the position embedding says which it supports
    pos_embed_mode: str = "input"
    # pooling and head
    pool: str = "token"
    pool_options: dict = field(default_factory=dict)
    head: str = "linear"
    head_options: dict = field(default_factory=dict)  # e.g. the MLP head's representation_size
    # numerics
    act: str = "gelu"
    norm_eps: float = 1e-6
    # the final LayerNorm on the pooled representation instead of on every token (timm's `fc_norm`,
    # its default with global_pool="avg"): forward_features then returns un-normed tokens
    fc_norm: bool = False
    # regularisation
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    # behaviour
    dynamic_img_size: bool = False
    # preprocessing the weights expect (recorded so that a saved model says how to feed it)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    # resize to img_size / crop_pct, then take the centre img_size crop (timm's pretrained_cfg; 1.0
    # resizes to img_size, as the paper's fine-tuning at 384 px did), with this interpolation
    crop_pct: float = 1.0
    interpolation: str = "bicubic"

    def __post_init__(self) -> None:
        # every option's type first (a str, a bool, a number in range), whatever gave it: code, a
        # flag, a file
        check_fields(self, {"crop_pct": "> 0"})
        self.img_size = _pair(self.img_size, "img_size")
        for key in PART_OPTIONS.values():
            if any(not isinstance(k, str) for k in getattr(self, key)):
                raise ConfigError(f"{key} must map option names (str) to values, got "
                                  f"{getattr(self, key)!r}")
            setattr(self, key, _json_form(getattr(self, key)))
        self.mean = _per_channel(self.mean, "mean", self.in_chans)
        self.std = _per_channel(self.std, "std", self.in_chans)
        self._check()

    # ------------------------------------------------------------------ checks
    def _check(self) -> None:
        positive = ("in_chans", "patch_size", "embed_dim", "num_heads", "mlp_dim")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {described(value)}")
        # depth 0 is a stem with the final norm and head only (e.g. the ResNet baseline of Figure 5)
        if not isinstance(self.depth, int) or isinstance(self.depth, bool) or self.depth < 0:
            raise ConfigError(f"depth must be an int >= 0, got {described(self.depth)}")
        if min(self.img_size) < 1:
            raise ConfigError(f"img_size must be positive, got {self.img_size}")
        if not isinstance(self.num_classes, int) or self.num_classes < 0:
            raise ConfigError("num_classes must be an int >= 0 (0 = features only), got "
                              f"{described(self.num_classes)}")
        if self.embed_dim % self.num_heads:
            raise ConfigError(
                f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}; "
                "choose num_heads that divides embed_dim"
            )
        if self.crop_pct > 1:
            raise ConfigError("crop_pct must be in (0, 1] (the centre crop's share of the resized "
                              f"image), got {self.crop_pct!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"interpolation={described(self.interpolation)} is not one of "
                              f"{INTERPOLATIONS}."
                              + closest(str(self.interpolation), INTERPOLATIONS))
        if self.act not in ACTIVATIONS:
            raise ConfigError(f"act={described(self.act)} is not one of {tuple(ACTIVATIONS)}."
                              + closest(self.act, ACTIVATIONS))
        for name in ("dropout", "attn_dropout", "drop_path", "norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigError(f"{name} must be a number, got {described(value)} "
                                  f"({type(value).__name__})")
        for name in ("dropout", "attn_dropout", "drop_path"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value!r}")
        if not self.norm_eps > 0:
            raise ConfigError(f"norm_eps must be > 0, got {self.norm_eps!r}")
        for name, values in (("mean", self.mean), ("std", self.std)):
            for value in values:
                # x / std: no std may be 0
                check_number(name, value, float, "> 0" if name == "std" else None)
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans:
            raise ConfigError(
                f"mean and std need one value per input channel (in_chans={self.in_chans}), "
                f"got mean={self.mean}, std={self.std}"
            )

    # ------------------------------------------------------------- reading and changing
    def replace(self, **changes: Any) -> ViTConfig:
        """A copy with some options changed. A part's options dict changes the options it names and
        keeps the others, while the part stays; naming another part starts from its defaults (only
        the options given with it)."""
        self.check_option_names(changes)
        for part, key in PART_OPTIONS.items():
            if changes.get(part, getattr(self, part)) != getattr(self, part):
                changes.setdefault(key, {})
            elif key in changes:
                if not isinstance(changes[key], dict):
                    raise ConfigError(f"{key} must be a dict of the {part}'s options, got "
                                      f"{changes[key]!r}")
                changes[key] = {**getattr(self, key), **changes[key]}
        return super().replace(**changes)

    def part_options(self, part: str) -> dict[str, Any]:
        """The options of one part ("stem", "pos_embed", "pool", "head"), as given."""
        return getattr(self, PART_OPTIONS[part])

    # ------------------------------------------------------------- derived
    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads


__all__ = ["ViTConfig", "PART_OPTIONS", "merge_options", "INTERPOLATIONS", "ACTIVATIONS",
           "HYBRID_NUMERICS"]
