"""ViTConfig: the single source of truth for one model, in the paper's names (D is `embed_dim`, L
`depth`, P `patch_size`). The four parts a model is built from (stem, position embedding, pool,
head) are named by a field each, with the part's own options in a dict beside it (`stem_options`,
...), which the part declares (its `Options`): a plugin adds options without touching this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitzoo.errors import ConfigError
from vitzoo.options import Options, check_fields, described, option

# the parts a model is built from: the field naming each, and the field holding its own options
PART_OPTIONS = {"stem": "stem_options", "pos_embed": "pos_embed_options", "pool": "pool_options",
                "head": "head_options"}
# where position information is added (Appendix D.4); a position embedding says which it supports
INJECTION_MODES = ("input", "every_layer", "every_layer_shared")
ACTIVATIONS = ("gelu", "gelu_tanh")  # exact GELU, or the official Flax code's tanh approximation
INTERPOLATIONS = ("bicubic", "bilinear", "nearest")  # torchvision's InterpolationMode names
# timm's ports of the hybrids need timm's ResNetV2 numerics (vitzoo.layers.resnet.NUMERICS)
HYBRID_NUMERICS = {"stem_options": {"numerics": "timm"}}
# timm's names of vitzoo's options (`from_timm_names`)
TIMM_SYNONYMS = {"drop_rate": "dropout", "attn_drop_rate": "attn_dropout",
                 "drop_path_rate": "drop_path"}
POOLS_OF_TIMM = {"token": "token", "avg": "gap"}  # timm's global_pool -> vitzoo's pool


def from_timm_names(options: dict) -> dict:
    """`options` with timm's names translated: drop_rate, attn_drop_rate, drop_path_rate,
    global_pool ("token", "avg") and class_token (False: global average pooling)."""
    options = {TIMM_SYNONYMS.get(k, k): v for k, v in options.items()}
    if "global_pool" in options:
        pool = options.pop("global_pool")
        if pool not in POOLS_OF_TIMM:
            raise ConfigError(f"global_pool={pool!r}: vitzoo pools the class token ('token') or "
                              "the average of all tokens ('avg', vitzoo's pool='gap')")
        options.setdefault("pool", POOLS_OF_TIMM[pool])
    if "class_token" in options:
        if options.pop("class_token") is False and options.setdefault("pool", "gap") == "token":
            raise ConfigError("class_token=False with pool='token': that pool needs a class token")
    return options


def merge_options(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` updated with `changes`, a part's options dict option by option (not replaced)."""
    merged = {**base, **changes}
    for key in PART_OPTIONS.values():
        if isinstance(base.get(key), dict) and isinstance(changes.get(key), dict):
            merged[key] = {**base[key], **changes[key]}
    return merged


def _json_form(value: Any) -> Any:
    """Tuples as lists, recursively: a part's options compare equal from code or from JSON."""
    if isinstance(value, dict):
        return {k: _json_form(v) for k, v in value.items()}
    return [_json_form(v) for v in value] if isinstance(value, (tuple, list)) else value


def _pair(value) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return tuple(value)
    raise ConfigError(f"img_size must be an int or a (height, width) pair, got {described(value)}")


def _per_channel(values, name: str) -> tuple[float, ...]:
    single = isinstance(values, (int, float)) and not isinstance(values, bool)
    try:
        return tuple(float(v) for v in ([values] if single else values))
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number or a sequence of numbers, got "
                          f"{described(values)}") from None


@dataclass
class ViTConfig(Options):
    """Every option of a Vision Transformer, with the defaults of ViT-B/16 at 224 px."""

    KIND = "model"
    OTHER_NAMES = {  # timm's names of no option here: what to give instead
        "mlp_ratio": "vitzoo takes mlp_dim, the MLP's width (timm's mlp_ratio times embed_dim)",
        "qkv_bias": "vitzoo's attention always has q, k and v biases, as the paper's",
        "no_embed_class": "vitzoo adds E_pos to the class token too, as the paper does",
        "reg_tokens": "register tokens are not part of the paper's ViT",
    }

    img_size: tuple[int, int] = option((224, 224), range="> 0", help="input (height, width)")
    in_chans: int = option(3, range="> 0")
    num_classes: int = option(1000, range=">= 0", help="0: the head returns the features")
    stem: str = option("patch", help="eq. (1)'s x_p E: patch | resnet (the hybrid) | a plugin's")
    stem_options: dict = option({})
    patch_size: int = option(16, range="> 0", help="P, on the image or the ResNet's feature map")
    embed_dim: int = option(768, range="> 0", help="D")
    depth: int = option(12, range=">= 0", help="L (0: the stem, final norm and head alone)")
    num_heads: int = option(12, range="> 0")
    mlp_dim: int = option(3072, range="> 0")
    pos_embed: str = option("learned_1d", help="none | learned_1d | learned_2d | relative")
    pos_embed_options: dict = option({})
    pos_embed_mode: str = option("input", choices=INJECTION_MODES)
    pool: str = option("token", help="token (the class token) | gap (global average)")
    pool_options: dict = option({})
    head: str = option("linear", help="linear | mlp (pre-logits Dense + tanh)")
    head_options: dict = option({})
    act: str = option("gelu", choices=ACTIVATIONS)
    norm_eps: float = option(1e-6, range="> 0")
    fc_norm: bool = option(False, help="the final LayerNorm after the pool (timm's fc_norm)")
    dropout: float = option(0.0, range="in [0, 1)")
    attn_dropout: float = option(0.0, range="in [0, 1)")
    drop_path: float = option(0.0, range="in [0, 1)", help="stochastic depth of the last block")
    dynamic_img_size: bool = option(False, help="take any image size the stride divides")
    # the preprocessing the weights expect: resize to img_size / crop_pct, crop the centre
    mean: tuple[float, ...] = option((0.5, 0.5, 0.5))
    std: tuple[float, ...] = option((0.5, 0.5, 0.5), range="> 0")
    crop_pct: float = option(1.0, range="in (0, 1]")
    interpolation: str = option("bicubic", choices=INTERPOLATIONS)

    def __post_init__(self) -> None:
        self.img_size = _pair(self.img_size)
        for key in PART_OPTIONS.values():
            setattr(self, key, _json_form(getattr(self, key)))
        self.mean, self.std = _per_channel(self.mean, "mean"), _per_channel(self.std, "std")
        check_fields(self)
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"embed_dim={self.embed_dim} is not divisible by "
                              f"num_heads={self.num_heads}")
        # one value for every channel (the default 0.5) fits any number of channels
        self.mean, self.std = (v[:1] * self.in_chans if len(set(v)) == 1 else v
                               for v in (self.mean, self.std))
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans:
            raise ConfigError(f"mean and std need one value per input channel (in_chans="
                              f"{self.in_chans}), got mean={self.mean}, std={self.std}")

    def replace(self, **changes: Any) -> ViTConfig:
        """A copy with some options changed. A part's options dict changes the options it names and
        keeps the others; naming another part starts from its defaults."""
        self.check_option_names(changes)
        for part, key in PART_OPTIONS.items():
            if changes.get(part, getattr(self, part)) != getattr(self, part):
                changes.setdefault(key, {})
            elif isinstance(changes.get(key), dict):
                changes[key] = {**getattr(self, key), **changes[key]}
        return super().replace(**changes)

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads
