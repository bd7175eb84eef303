"""torchvision's VisionTransformer state dicts (`vit_b_16`, `vit_l_32`, ...; `torchvision.models`).

Names: `conv_proj.*`, `class_token` (1, 1, D), `encoder.pos_embedding` (1, T, D),
`encoder.layers.encoder_layer_{i}.{ln_1, self_attention.in_proj_{weight,bias},
self_attention.out_proj, ln_2, mlp.0, mlp.3}`, `encoder.ln`, `heads.head` and, with
`representation_size`, `heads.pre_logits` (Dense + tanh). The fused in-projection has vitzoo's
q, k, v order already. torchvision's GELU is exact (erf) and its LayerNorm eps 1e-6.
"""

from __future__ import annotations

import re

import torch

from vitzoo.weights.converted import ConvertedWeights, take_head
from vitzoo.weights.formats import Metadata, WeightFormat
from vitzoo.weights.layout import square_grid

FORMAT = "torchvision"
# torchvision's ImageNet weights expect ImageNet normalisation (used when a config is inferred)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

_BLOCK = re.compile(r"^encoder\.layers\.encoder_layer_(\d+)\.(.+)$")
_BLOCK_NAMES = {
    "ln_1.weight": "norm1.weight", "ln_1.bias": "norm1.bias",
    "self_attention.in_proj_weight": "attn.qkv.weight",
    "self_attention.in_proj_bias": "attn.qkv.bias",
    "self_attention.out_proj.weight": "attn.proj.weight",
    "self_attention.out_proj.bias": "attn.proj.bias", "ln_2.weight": "norm2.weight",
    "ln_2.bias": "norm2.bias", "mlp.0.weight": "mlp.fc1.weight", "mlp.0.bias": "mlp.fc1.bias",
    "mlp.3.weight": "mlp.fc2.weight", "mlp.3.bias": "mlp.fc2.bias",
    # torchvision < 0.13 named the MLP layers linear_1 / linear_2
    "mlp.linear_1.weight": "mlp.fc1.weight", "mlp.linear_1.bias": "mlp.fc1.bias",
    "mlp.linear_2.weight": "mlp.fc2.weight", "mlp.linear_2.bias": "mlp.fc2.bias",
}


class TorchvisionFormat(WeightFormat):
    name = FORMAT
    marks = ("conv_proj.weight", "encoder.pos_embedding")

    def convert(self, state_dict: dict[str, torch.Tensor], metadata: Metadata) -> ConvertedWeights:
        """torchvision names -> a vitzoo `ConvertedWeights` (unknown keys kept for the loader)."""
        params = dict(state_dict)
        out: dict[str, torch.Tensor] = {}
        out["stem.proj.weight"] = params.pop("conv_proj.weight")
        out["stem.proj.bias"] = params.pop("conv_proj.bias")
        out["cls_token"] = params.pop("class_token")
        pos = params.pop("encoder.pos_embedding")
        out["encoder.pos_embed.weight"] = pos
        grid = square_grid(pos.shape[1] - 1, FORMAT)
        for key in list(params):
            match = _BLOCK.match(key)
            if match and match.group(2) in _BLOCK_NAMES:
                name = f"{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}"
                out[f"encoder.blocks.{name}"] = params.pop(key)
        for kind in ("weight", "bias"):
            out[f"encoder.norm.{kind}"] = params.pop(f"encoder.ln.{kind}")
        config: dict = {"act": "gelu", "norm_eps": 1e-6, "pool": "token"}
        take_head(params, out, config, pre_logits="heads.pre_logits", classifier="heads.head")
        out.update(params)
        return ConvertedWeights(format=FORMAT, state_dict=out, config=config, grid=grid)

    def hints(self, metadata: Metadata) -> dict:
        return {"mean": MEAN, "std": STD}
