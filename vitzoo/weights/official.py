"""The official checkpoint format (google-research/vision_transformer `.npz`).

Keys are Flax parameter paths joined with '/'. Layouts differ from PyTorch: conv kernels are HWIO,
dense kernels are (in, out), attention q/k/v kernels are (D, heads, D/heads) and the output kernel
(heads, D/heads, D). Older hybrid checkpoints store GroupNorm parameters as (1, 1, 1, C).
"""

from __future__ import annotations

import re
from typing import Mapping

import numpy as np
import torch

from vitzoo.weights.converted import ConvertedWeights, take_head
from vitzoo.weights.formats import Metadata, WeightFormat
from vitzoo.weights.layout import square_grid

FORMAT = "official-npz"
BLOCK = "Transformer/encoderblock_"
RESNET_PARAM = re.compile(r"^block(\d+)/unit(\d+)/"
                          r"(conv[123]|conv_proj|gn[123]|gn_proj)/(kernel|scale|bias)$")


def _conv(kernel: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(kernel).permute(3, 2, 0, 1)  # HWIO -> OIHW


def _dense(kernel: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(kernel).t()  # (in, out) -> (out, in)


def _vector(value: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(value).reshape(-1)  # (C,) or (1, 1, 1, C)


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
    biases = [_vector(params.pop(f"{attn}{n}/bias")) for n in ("query", "key", "value")]
    out[dst + "attn.qkv.bias"] = torch.cat(biases)
    out[dst + "attn.proj.weight"] = _dense(params.pop(attn + "out/kernel").reshape(-1, dim))
    out[dst + "attn.proj.bias"] = _vector(params.pop(attn + "out/bias"))
    _norm(params, src + "LayerNorm_2", dst + "norm2", out)
    for j, name in ((0, "fc1"), (1, "fc2")):
        out[f"{dst}mlp.{name}.weight"] = _dense(params.pop(f"{src}MlpBlock_3/Dense_{j}/kernel"))
        out[f"{dst}mlp.{name}.bias"] = _vector(params.pop(f"{src}MlpBlock_3/Dense_{j}/bias"))


def _resnet(params: dict, out: dict) -> None:
    prefix = "stem.backbone."
    out[prefix + "conv_root.weight"] = _conv(params.pop("conv_root/kernel"))
    _norm(params, "gn_root", prefix + "gn_root", out)
    for key in sorted(k for k in params if RESNET_PARAM.match(k)):
        stage, unit, layer, kind = RESNET_PARAM.match(key).groups()
        name = f"{prefix}stages.{int(stage) - 1}.{int(unit) - 1}.{layer}"
        value = params.pop(key)
        if kind == "kernel":
            out[name + ".weight"] = _conv(value)
        else:
            out[name + (".weight" if kind == "scale" else ".bias")] = _vector(value)


class OfficialFormat(WeightFormat):
    """Read from an .npz (`vitzoo.checkpoints.sources`), or any state dict file with these names."""

    name = FORMAT
    marks = ("embedding/kernel", "Transformer/encoder_norm/scale")

    def convert(self, npz: Mapping[str, np.ndarray], metadata: Metadata) -> ConvertedWeights:
        """Official parameters -> a vitzoo `ConvertedWeights`. Keys it does not know are kept under
        their own name, so that the strict loader reports them."""
        params = {k: np.asarray(v, dtype=np.float32) for k, v in npz.items()}
        out: dict[str, torch.Tensor] = {}
        hybrid = "conv_root/kernel" in params
        if hybrid:
            _resnet(params, out)
        out["stem.proj.weight"] = _conv(params.pop("embedding/kernel"))
        out["stem.proj.bias"] = _vector(params.pop("embedding/bias"))
        has_class_token = "cls" in params
        if has_class_token:
            out["cls_token"] = torch.from_numpy(params.pop("cls")).reshape(1, 1, -1)
        pos = params.pop("Transformer/posembed_input/pos_embedding", None)
        grid = None
        if pos is not None:
            out["encoder.pos_embed.weight"] = torch.from_numpy(pos)
            grid = square_grid(pos.shape[1] - int(has_class_token), "official")
        depth = 0
        query = params.get(f"{BLOCK}0/MultiHeadDotProductAttention_1/query/kernel")
        # the query kernel is (D, heads, D/heads)
        heads = {"num_heads": int(query.shape[1])} if query is not None and query.ndim == 3 else {}
        while f"{BLOCK}{depth}/LayerNorm_0/scale" in params:
            _block(params, depth, out)
            depth += 1
        _norm(params, "Transformer/encoder_norm", "encoder.norm", out)
        config: dict = {"act": "gelu_tanh", "norm_eps": 1e-6,
                        "pool": "token" if has_class_token else "gap", **heads}
        # the head's Dense layers in PyTorch's layout, then moved as every format's head is
        head = {f"{layer}.{name}": convert_param(params.pop(f"{layer}/{kind}"))
                for layer in ("pre_logits", "head") if f"{layer}/kernel" in params
                for kind, name, convert_param in (("kernel", "weight", _dense),
                                                  ("bias", "bias", _vector))}
        take_head(head, out, config, pre_logits="pre_logits", classifier="head")
        for key, value in params.items():  # anything left over is reported by the strict loader
            out[key] = torch.from_numpy(value)
        out = {k: v.contiguous() for k, v in out.items()}
        return ConvertedWeights(format=FORMAT, state_dict=out, config=config, grid=grid)
