"""The official checkpoint format (google-research/vision_transformer `.npz`).

Keys are Flax parameter paths joined with '/'. Layouts differ from PyTorch: conv kernels are HWIO,
dense kernels are (in, out), attention q/k/v kernels are (D, heads, D/heads) and the output kernel
(heads, D/heads, D). Older hybrid checkpoints store GroupNorm parameters as (1, 1, 1, C).
"""

from __future__ import annotations

import math
import re
from typing import Mapping

import numpy as np
import torch

from vitzoo.weights.checkpoint import Checkpoint, CheckpointError, read_failed

FORMAT = "official-npz"
BLOCK = "Transformer/encoderblock_"
RESNET_PARAM = re.compile(r"^block(\d+)/unit(\d+)/(conv[123]|conv_proj|gn[123]|gn_proj)/(kernel|scale|bias)$")


def looks_official(keys) -> bool:
    keys = set(keys)
    return "embedding/kernel" in keys and "Transformer/encoder_norm/scale" in keys


def _conv(kernel: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(kernel).permute(3, 2, 0, 1)  # HWIO -> OIHW


def _dense(kernel: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(kernel).t()  # (in, out) -> (out, in)


def _vector(value: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(value).reshape(-1)  # (C,) or the older (1, 1, 1, C)


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
    out[dst + "attn.qkv.bias"] = torch.cat([_vector(params.pop(f"{attn}{n}/bias")) for n in ("query", "key", "value")])
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


def convert(npz: Mapping[str, np.ndarray]) -> Checkpoint:
    """Official parameters -> a vitzoo `Checkpoint`. Keys it does not know are kept under their own
    name, so that the strict loader reports them."""
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
        num_patches = pos.shape[1] - int(has_class_token)
        side = math.isqrt(num_patches)
        if side * side != num_patches:
            raise CheckpointError(f"official position embedding has {num_patches} patch positions, not a square grid")
        grid = (side, side)
    depth = 0
    query = params.get(f"{BLOCK}0/MultiHeadDotProductAttention_1/query/kernel")
    heads = {"num_heads": int(query.shape[1])} if query is not None and query.ndim == 3 else {}  # (D, heads, D/heads)
    while f"{BLOCK}{depth}/LayerNorm_0/scale" in params:
        _block(params, depth, out)
        depth += 1
    _norm(params, "Transformer/encoder_norm", "encoder.norm", out)
    config: dict = {"act": "gelu_tanh", "norm_eps": 1e-6, "pool": "token" if has_class_token else "gap", "head": "linear",
                    **heads}
    if "pre_logits/kernel" in params:
        kernel = params.pop("pre_logits/kernel")
        out["head.pre_logits.weight"] = _dense(kernel)
        out["head.pre_logits.bias"] = _vector(params.pop("pre_logits/bias"))
        config.update(head="mlp", representation_size=int(kernel.shape[1]))
    else:
        config["representation_size"] = None
    if "head/kernel" in params:
        kernel = params.pop("head/kernel")
        out["head.fc.weight"] = _dense(kernel)
        out["head.fc.bias"] = _vector(params.pop("head/bias"))
        config["num_classes"] = int(kernel.shape[1])
    else:
        config["num_classes"] = 0
    for key, value in params.items():  # anything left over is reported by the strict loader
        out[key] = torch.from_numpy(value)
    out = {k: v.contiguous() for k, v in out.items()}
    return Checkpoint(format=FORMAT, state_dict=out, config=config, grid=grid)


ZIP_STARTS = (b"PK\x03\x04", b"PK\x05\x06")  # an .npz is a zip archive (one of arrays, or empty)


def _arrays(path: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz file. Anything else (empty, not a zip, pickled objects) is a
    CheckpointError saying it is not a checkpoint: numpy's own advice would be to allow pickles."""
    try:
        with open(path, "rb") as f:
            start = f.read(4)
    except OSError as exc:
        raise read_failed(path, exc) from exc
    if start not in ZIP_STARTS:
        what = "empty" if not start else "not a zip archive of arrays, as an .npz is"
        raise CheckpointError(f"{path} is not a checkpoint: the file is {what}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.keys()}
    except ValueError as exc:  # numpy refuses object arrays without allow_pickle: never allow them
        raise CheckpointError(f"{path} is not a checkpoint: it holds pickled Python objects, which vitzoo "
                              "never loads (an official checkpoint holds arrays of numbers only)") from exc
    except Exception as exc:  # zipfile and numpy raise several types for a truncated archive
        raise read_failed(path, exc) from exc


def read(path: str) -> Checkpoint:
    arrays = _arrays(path)
    keys = list(arrays)
    if not looks_official(keys):
        raise CheckpointError(
            f"{path} is an .npz file but not an official ViT checkpoint (no 'embedding/kernel' and "
            f"'Transformer/encoder_norm/scale'); found keys such as {keys[:5]}"
        )
    return convert(arrays)
