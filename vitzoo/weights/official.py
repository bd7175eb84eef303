"""The official checkpoints (google-research/vision_transformer `.npz`): Flax paths joined with
'/'; HWIO conv kernels, (in, out) dense ones, q, k, v kernels (D, heads, D/heads); GroupNorm may
be stored (1, 1, 1, C). GELU is the tanh approximation."""

from __future__ import annotations

import re

import numpy as np
import torch

from vitzoo.weights import ConvertedWeights, WeightFormat
from vitzoo.weights.layout import square_grid, take_head

FORMAT = "official-npz"
BLOCK = "Transformer/encoderblock_"
RESNET = re.compile(r"^block(\d+)/unit(\d+)/(conv[123]|conv_proj|gn[123]|gn_proj)/"
                    r"(kernel|scale|bias)$")


def _conv(kernel: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(kernel).permute(3, 2, 0, 1)  # HWIO -> OIHW


def _dense(kernel: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(kernel).t()  # (in, out) -> (out, in)


def _vector(value: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(value).reshape(-1)


def _norm(params: dict, src: str, dst: str, out: dict) -> None:
    out[f"{dst}.weight"] = _vector(params.pop(f"{src}/scale"))
    out[f"{dst}.bias"] = _vector(params.pop(f"{src}/bias"))


def _block(params: dict, i: int, out: dict) -> None:
    src, dst = f"{BLOCK}{i}/", f"encoder.blocks.{i}."
    attn = src + "MultiHeadDotProductAttention_1/"
    _norm(params, src + "LayerNorm_0", dst + "norm1", out)
    qkv = [params.pop(f"{attn}{name}/kernel") for name in ("query", "key", "value")]
    dim = qkv[0].shape[0]
    out[dst + "attn.qkv.weight"] = torch.cat([_dense(k.reshape(dim, -1)) for k in qkv])
    out[dst + "attn.qkv.bias"] = torch.cat([_vector(params.pop(f"{attn}{n}/bias"))
                                            for n in ("query", "key", "value")])
    out[dst + "attn.proj.weight"] = _dense(params.pop(attn + "out/kernel").reshape(-1, dim))
    out[dst + "attn.proj.bias"] = _vector(params.pop(attn + "out/bias"))
    _norm(params, src + "LayerNorm_2", dst + "norm2", out)
    for j, name in ((0, "fc1"), (1, "fc2")):
        out[f"{dst}mlp.{name}.weight"] = _dense(params.pop(f"{src}MlpBlock_3/Dense_{j}/kernel"))
        out[f"{dst}mlp.{name}.bias"] = _vector(params.pop(f"{src}MlpBlock_3/Dense_{j}/bias"))


def _resnet(params: dict, out: dict) -> None:
    out["stem.backbone.conv_root.weight"] = _conv(params.pop("conv_root/kernel"))
    _norm(params, "gn_root", "stem.backbone.gn_root", out)
    for key in sorted(k for k in params if RESNET.match(k)):
        stage, unit, layer, kind = RESNET.match(key).groups()
        name = f"stem.backbone.stages.{int(stage) - 1}.{int(unit) - 1}.{layer}"
        value = params.pop(key)
        if kind == "kernel":
            out[f"{name}.weight"] = _conv(value)
        else:
            out[f"{name}.{'weight' if kind == 'scale' else 'bias'}"] = _vector(value)


class OfficialFormat(WeightFormat):
    name = FORMAT
    marks = ("embedding/kernel", "Transformer/encoder_norm/scale")

    def convert(self, npz, metadata) -> ConvertedWeights:
        params = {k: np.asarray(v, dtype=np.float32) for k, v in npz.items()}
        out: dict[str, torch.Tensor] = {}
        if "conv_root/kernel" in params:
            _resnet(params, out)
        out["stem.proj.weight"] = _conv(params.pop("embedding/kernel"))
        out["stem.proj.bias"] = _vector(params.pop("embedding/bias"))
        token = "cls" in params
        if token:
            out["cls_token"] = torch.from_numpy(params.pop("cls")).reshape(1, 1, -1)
        pos, grid = params.pop("Transformer/posembed_input/pos_embedding", None), None
        if pos is not None:
            out["encoder.pos_embed.weight"] = torch.from_numpy(pos)
            grid = square_grid(pos.shape[1] - token, "official")
        config: dict = {"act": "gelu_tanh", "norm_eps": 1e-6, "pool": "token" if token else "gap"}
        query = params.get(f"{BLOCK}0/MultiHeadDotProductAttention_1/query/kernel")
        if query is not None and query.ndim == 3:  # (D, heads, D/heads): the heads are stated
            config["num_heads"] = int(query.shape[1])
        depth = 0
        while f"{BLOCK}{depth}/LayerNorm_0/scale" in params:
            _block(params, depth, out)
            depth += 1
        _norm(params, "Transformer/encoder_norm", "encoder.norm", out)
        head = {f"{layer}.{name}": convert(params.pop(f"{layer}/{kind}"))
                for layer in ("pre_logits", "head") if f"{layer}/kernel" in params
                for kind, name, convert in (("kernel", "weight", _dense),
                                            ("bias", "bias", _vector))}
        take_head(head, out, config, pre_logits="pre_logits", classifier="head")
        out.update((k, torch.from_numpy(v)) for k, v in params.items())  # for the strict loader
        return ConvertedWeights(FORMAT, {k: v.contiguous() for k, v in out.items()}, config, grid)
