"""An independent flax.linen re-implementation of the official JAX ViT (google-research's
vision_transformer), written from shared/reference/vit-paper.md, to check vitzoo against: its
module names give the official .npz keys, and it uses flax's layers as the official code does
(eps 1e-6, tanh GELU, TF "SAME" padding), dropout off. `make_checkpoint` writes a perturbed model
as an official .npz, `official_logits` runs one, `official_param_count` counts its parameters.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.traverse_util import flatten_dict, unflatten_dict

GROUPNORM = re.compile(r"^gn(_root|_proj|\d+)$")  # the modules holding GroupNorm parameters


class StdConv(nn.Conv):  # the HWIO kernel standardised over (H, W, in) when used, stored raw

    def param(self, name: str, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        value = super().param(name, *args, **kwargs)
        if name == "kernel":
            value = value - jnp.mean(value, axis=(0, 1, 2), keepdims=True)
            value = value / (jnp.std(value, axis=(0, 1, 2), keepdims=True) + 1e-5)
        return value


def group_norm(name: str, **kwargs: Any) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=32, epsilon=1e-6, name=name, **kwargs)


class ResidualUnit(nn.Module):  # post-activation bottleneck, the stride on the 3x3 conv
    features: int
    strides: tuple[int, int] = (1, 1)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        residual = x
        if x.shape[-1] != self.features * 4 or self.strides != (1, 1):
            residual = StdConv(self.features * 4, (1, 1), self.strides, use_bias=False,
                               name="conv_proj")(residual)
            residual = group_norm("gn_proj")(residual)
        y = StdConv(self.features, (1, 1), use_bias=False, name="conv1")(x)
        y = nn.relu(group_norm("gn1")(y))
        y = StdConv(self.features, (3, 3), self.strides, padding="SAME", use_bias=False,
                    name="conv2")(y)
        y = nn.relu(group_norm("gn2")(y))
        y = StdConv(self.features * 4, (1, 1), use_bias=False, name="conv3")(y)
        return nn.relu(residual + group_norm("gn3", scale_init=nn.initializers.zeros)(y))


class ResNetStage(nn.Module):
    block_size: int
    features: int
    first_stride: tuple[int, int]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i in range(self.block_size):
            x = ResidualUnit(self.features, strides=self.first_stride if i == 0 else (1, 1),
                             name=f"unit{i + 1}")(x)
        return x


class AddPositionEmbs(nn.Module):
    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return x + self.param("pos_embedding", nn.initializers.normal(stddev=0.02),
                              (1, x.shape[1], x.shape[2]))


class MlpBlock(nn.Module):
    mlp_dim: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dense = functools.partial(nn.Dense, kernel_init=nn.initializers.xavier_uniform(),
                                  bias_init=nn.initializers.normal(stddev=1e-6))
        y = nn.gelu(dense(self.mlp_dim, name="Dense_0")(x))  # tanh GELU, flax's default
        return dense(x.shape[-1], name="Dense_1")(y)


class Encoder1DBlock(nn.Module):  # its modules named with the indices of the old flax.nn API
    mlp_dim: int
    num_heads: int

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        x = nn.LayerNorm(epsilon=1e-6, name="LayerNorm_0")(inputs)
        x = inputs + nn.MultiHeadDotProductAttention(
            num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(),
            broadcast_dropout=False, dropout_rate=0.0, deterministic=True,
            name="MultiHeadDotProductAttention_1")(x)
        y = nn.LayerNorm(epsilon=1e-6, name="LayerNorm_2")(x)
        return x + MlpBlock(self.mlp_dim, name="MlpBlock_3")(y)


class Encoder(nn.Module):
    num_layers: int
    mlp_dim: int
    num_heads: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = AddPositionEmbs(name="posembed_input")(x)
        for i in range(self.num_layers):
            x = Encoder1DBlock(self.mlp_dim, self.num_heads, name=f"encoderblock_{i}")(x)
        return nn.LayerNorm(epsilon=1e-6, name="encoder_norm")(x)


class OfficialViT(nn.Module):  # R+ViT with `resnet_layers` (units per stage); NHWC in, logits out
    num_classes: int
    patch_size: int
    hidden_size: int
    num_layers: int
    mlp_dim: int
    num_heads: int
    classifier: str = "token"  # or "gap"
    representation_size: int | None = None
    resnet_layers: tuple[int, ...] | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if self.resnet_layers is not None:
            width = 64
            x = StdConv(width, (7, 7), (2, 2), padding="SAME", use_bias=False, name="conv_root")(x)
            x = nn.relu(group_norm("gn_root")(x))
            x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding="SAME")
            for i, block_size in enumerate(self.resnet_layers):
                x = ResNetStage(block_size, width * 2**i, (1, 1) if i == 0 else (2, 2),
                                name=f"block{i + 1}")(x)
        p = self.patch_size
        x = nn.Conv(self.hidden_size, (p, p), strides=(p, p), padding="VALID", name="embedding")(x)
        n, h, w, c = x.shape
        x = jnp.reshape(x, (n, h * w, c))
        if self.classifier == "token":
            cls = self.param("cls", nn.initializers.zeros, (1, 1, c))
            x = jnp.concatenate([jnp.tile(cls, (n, 1, 1)).astype(x.dtype), x], axis=1)
        x = Encoder(self.num_layers, self.mlp_dim, self.num_heads, name="Transformer")(x)
        x = x[:, 0] if self.classifier == "token" else jnp.mean(x, axis=1)
        if self.representation_size is not None:
            x = jnp.tanh(nn.Dense(self.representation_size, name="pre_logits")(x))
        return nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros,
                        bias_init=nn.initializers.zeros, name="head")(x)


def is_group_norm(key: str) -> bool:
    parts = key.split("/")
    return len(parts) >= 2 and parts[-1] in ("scale", "bias") and bool(GROUPNORM.match(parts[-2]))


def _build(fields: Mapping[str, Any]) -> OfficialViT:
    layers = fields.get("resnet_layers")
    return OfficialViT(**{**fields, "resnet_layers": None if layers is None else tuple(layers)})


@functools.lru_cache(maxsize=None)
def _compiled_init(model: OfficialViT, img_size: int) -> Any:
    """`model.init` compiled once per input size, unoptimised (it compiles faster)."""
    dummy = jnp.zeros((1, img_size, img_size, 3), jnp.float32)
    lowered = jax.jit(model.init).lower(jax.random.PRNGKey(0), dummy)
    return lowered.compile(compiler_options={"xla_backend_optimization_level": 0})


@functools.lru_cache(maxsize=None)
def _jitted_apply(model: OfficialViT) -> Any:
    return jax.jit(model.apply)


def make_checkpoint(path: str | os.PathLike[str], *, img_size: int, seed: int = 0,
                    groupnorm_4d: bool = False, **fields: Any) -> dict[str, np.ndarray]:
    """Initialise `OfficialViT(**fields)` at `img_size`, add noise of std 0.1 * rms(p) + 0.05 to
    every parameter p (so that the zero-initialised ones are not), save it with np.savez under
    the official flat keys and return what was written. `seed` seeds both."""
    model = _build(fields)
    dummy = jnp.zeros((1, img_size, img_size, 3), jnp.float32)
    params = _compiled_init(model, img_size)(jax.random.PRNGKey(seed), dummy)["params"]
    flat = {"/".join(k): np.asarray(v) for k, v in flatten_dict(dict(params)).items()}
    rng, out = np.random.default_rng(seed), {}
    for key in sorted(flat):
        p = np.asarray(flat[key], dtype=np.float64)
        rms = float(np.sqrt(np.mean(p * p))) if p.size else 0.0
        p = (p + rng.standard_normal(p.shape) * (0.1 * rms + 0.05)).astype(np.float32)
        out[key] = p.reshape(1, 1, 1, -1) if groupnorm_4d and is_group_norm(key) else p
    np.savez(path, **out)
    return out


def official_logits(params_flat: Mapping[str, Any], images_nchw: np.ndarray,
                    **fields: Any) -> np.ndarray:
    """The flax model's logits (as float64) on NCHW images, computed in float32."""
    tree = {tuple(k.split("/")): jnp.asarray(np.asarray(v, np.float32).reshape(-1)
                                             if is_group_norm(k) else np.asarray(v, np.float32))
            for k, v in params_flat.items()}
    x = jnp.asarray(np.asarray(images_nchw).transpose(0, 2, 3, 1).astype(np.float32))
    logits = _jitted_apply(_build(fields))({"params": unflatten_dict(tree)}, x)
    return np.asarray(logits, dtype=np.float64)


def official_param_count(img_size: int, **fields: Any) -> int:
    """The number of parameters at `img_size` (3 channels; num_classes 1000 unless given)."""
    model = _build({"num_classes": 1000, **fields})
    dummy = jax.ShapeDtypeStruct((1, img_size, img_size, 3), jnp.float32)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy)
    return int(sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(shapes)))
