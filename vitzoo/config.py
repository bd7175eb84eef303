"""ViTConfig: the single source of truth for one model.

Every option a user can pass to `vitzoo.create` is a field here, with the names of the paper
(`embed_dim` is D, `depth` is L, `mlp_dim` is the MLP size, `patch_size` is P). Components receive
this dataclass, never loose keyword arguments. Checks that need the registry (is `stem="foo"` a
known component?) happen when a model is built; everything else is checked here, on construction.
"""

from __future__ import annotations

from dataclasses import dataclass

from vitzoo.errors import ConfigError
from vitzoo.options import Options, check_fields, check_number, closest

# The names an option may take. The config is plain data: it names what the layers build, and the
# layers (which import the config) hold what each name means.
POS_EMBED_MODES = ("input", "every_layer", "every_layer_shared")
# timm's names for options vitzoo spells otherwise, taken where the meaning is the same (`from_timm_names`)
TIMM_SYNONYMS = {"drop_rate": "dropout", "attn_drop_rate": "attn_dropout", "drop_path_rate": "drop_path"}
POOLS_OF_TIMM = {"token": "token", "avg": "gap"}  # timm's global_pool -> vitzoo's pool


def from_timm_names(options: dict) -> dict:
    """`options` with timm's names of vitzoo's options translated: drop_rate, attn_drop_rate,
    drop_path_rate, global_pool ("token", "avg") and class_token (False: global average pooling)."""
    options = {TIMM_SYNONYMS.get(k, k): v for k, v in options.items()}
    if "global_pool" in options:
        pool = options.pop("global_pool")
        if pool not in POOLS_OF_TIMM:
            raise ConfigError(f"global_pool={pool!r}: vitzoo pools with the class token (timm's 'token') or the "
                              f"average of all tokens ('avg', vitzoo's pool='gap')")
        options.setdefault("pool", POOLS_OF_TIMM[pool])
    if "class_token" in options:
        if options.pop("class_token") is False and options.setdefault("pool", "gap") == "token":
            raise ConfigError("class_token=False with pool='token': pooling the class token needs one")
    return options


# how an image is resized to the model's input (torchvision's InterpolationMode names)
INTERPOLATIONS = ("bicubic", "bilinear", "nearest")
# `act`: the MLP's nonlinearity, exact GELU or the official Flax code's tanh approximation (their
# functions: vitzoo.layers.activations.ACTIVATIONS)
ACTIVATIONS = ("gelu", "gelu_tanh")
# `resnet_numerics`: the hybrid ResNet's weight standardisation and GroupNorm eps, the official model's
# or timm's ResNetV2's (their numbers: vitzoo.layers.resnet.NUMERICS)
RESNET_NUMERICS = ("official", "timm")
# the options timm's ports of the hybrids need for the same logits (the timm format and the zoo's tags)
HYBRID_NUMERICS = {"resnet_numerics": "timm"}


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
        raise ConfigError(f"{option} must be a number or a sequence of numbers, got {values!r}") from None
    if len(values) != in_chans and values and len(set(values)) == 1:
        values = values[:1] * in_chans
    return values


@dataclass
class ViTConfig(Options):
    """Every option of a Vision Transformer, with the defaults of ViT-B/16 at 224 px."""

    KIND = "model"  # in errors: "unknown model option ..."
    OTHER_NAMES = {  # timm's names without a vitzoo equivalent: what to do instead
        "mlp_ratio": "vitzoo takes mlp_dim, the MLP's width (timm's mlp_ratio times embed_dim)",
        "qkv_bias": "vitzoo's attention always has q, k and v biases, as the paper's",
        "no_embed_class": "vitzoo adds the position embedding to the class token too, as the paper does",
        "reg_tokens": "register tokens are not part of the paper's ViT",
    }

    # input
    img_size: tuple[int, int] = (224, 224)
    in_chans: int = 3
    num_classes: int = 1000
    # stem: how the image becomes a sequence of tokens (eq. 1)
    stem: str = "patch"
    patch_size: int = 16  # on the image for `patch`, on the ResNet feature map for `resnet`
    resnet_layers: tuple[int, ...] = ()  # blocks per stage of the hybrid's ResNet
    resnet_width: int = 1  # ResNet width factor: the root has 64 * resnet_width channels
    # weight standardisation and GroupNorm eps of the ResNet: "official" (w - mean) / (std + 1e-5) and
    # eps 1e-6, or "timm" (w - mean) / sqrt(var + 1e-8) and eps 1e-5 (what timm's hybrid weights need)
    resnet_numerics: str = "official"
    # the Transformer encoder (eq. 2-4)
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    # position information
    pos_embed: str = "learned_1d"
    pos_embed_mode: str = "input"
    # pooling and head
    pool: str = "token"
    head: str = "linear"
    representation_size: int | None = None
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
        # every option's type first (a str, a bool, a number in range), whatever gave it: code, a flag, a file
        check_fields(self, {"representation_size": "> 0", "crop_pct": "> 0"})
        self.img_size = _pair(self.img_size, "img_size")
        self.resnet_layers = tuple(self.resnet_layers)
        self.mean, self.std = _per_channel(self.mean, "mean", self.in_chans), _per_channel(self.std, "std", self.in_chans)
        self._check()

    # ------------------------------------------------------------------ checks
    def _check(self) -> None:
        positive = ("in_chans", "patch_size", "resnet_width", "embed_dim", "num_heads", "mlp_dim")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        # depth 0 is a stem with the final norm and head only (e.g. the ResNet baseline of Figure 5)
        if not isinstance(self.depth, int) or isinstance(self.depth, bool) or self.depth < 0:
            raise ConfigError(f"depth must be an int >= 0, got {self.depth!r}")
        if min(self.img_size) < 1:
            raise ConfigError(f"img_size must be positive, got {self.img_size}")
        if not isinstance(self.num_classes, int) or self.num_classes < 0:
            raise ConfigError(f"num_classes must be an int >= 0 (0 = features only), got {self.num_classes!r}")
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in self.resnet_layers):
            raise ConfigError(f"resnet_layers must be positive block counts per stage, got {self.resnet_layers}")
        if self.embed_dim % self.num_heads:
            raise ConfigError(
                f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}; "
                "choose num_heads that divides embed_dim"
            )
        if self.pos_embed_mode not in POS_EMBED_MODES:
            raise ConfigError(
                f"pos_embed_mode={self.pos_embed_mode!r} is not one of {POS_EMBED_MODES}."
                + closest(self.pos_embed_mode, POS_EMBED_MODES)
            )
        if self.resnet_numerics not in RESNET_NUMERICS:
            raise ConfigError(
                f"resnet_numerics={self.resnet_numerics!r} is not one of {tuple(RESNET_NUMERICS)}."
                + closest(self.resnet_numerics, RESNET_NUMERICS)
            )
        if self.crop_pct > 1:
            raise ConfigError(f"crop_pct must be in (0, 1] (the centre crop's share of the resized image), got {self.crop_pct!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"interpolation={self.interpolation!r} is not one of {INTERPOLATIONS}."
                              + closest(str(self.interpolation), INTERPOLATIONS))
        if self.act not in ACTIVATIONS:
            raise ConfigError(f"act={self.act!r} is not one of {tuple(ACTIVATIONS)}." + closest(self.act, ACTIVATIONS))
        for name in ("dropout", "attn_dropout", "drop_path", "norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ConfigError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
        for name in ("dropout", "attn_dropout", "drop_path"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value!r}")
        if not self.norm_eps > 0:
            raise ConfigError(f"norm_eps must be > 0, got {self.norm_eps!r}")
        for name, values in (("mean", self.mean), ("std", self.std)):
            for value in values:
                check_number(name, value, float, "> 0" if name == "std" else None)  # x / std: none may be 0
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans:
            raise ConfigError(
                f"mean and std need one value per input channel (in_chans={self.in_chans}), "
                f"got mean={self.mean}, std={self.std}"
            )

    # ------------------------------------------------------------- derived
    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads


# the options that make a model another architecture (the rest change its input, head or numerics)
SHAPE_OPTIONS = ("stem", "embed_dim", "depth", "num_heads", "mlp_dim", "resnet_layers")


def shape_differences(saved: ViTConfig, requested: ViTConfig) -> list[str]:
    """How the model a saved config describes differs in shape from the one requested, as
    'option=saved (not requested)' items; [] when they are the same architecture."""
    return [f"{k}={getattr(saved, k)!r} (not {getattr(requested, k)!r})" for k in SHAPE_OPTIONS
            if getattr(saved, k) != getattr(requested, k)]


__all__ = ["ViTConfig", "POS_EMBED_MODES", "INTERPOLATIONS", "ACTIVATIONS", "RESNET_NUMERICS", "HYBRID_NUMERICS",
           "SHAPE_OPTIONS", "shape_differences"]
