"""torchvision's VisionTransformer state dicts (`vit_b_16`, ...): `conv_proj`, `class_token`,
`encoder.pos_embedding`, `encoder.layers.encoder_layer_{i}` (the in-projection already q, k, v),
`encoder.ln`, `heads`. GELU exact, eps 1e-6."""

from __future__ import annotations

import re

from vitzoo.weights import ConvertedWeights, WeightFormat
from vitzoo.weights.layout import square_grid, take_head

FORMAT = "torchvision"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as its weights expect
BLOCK = re.compile(r"^encoder\.layers\.encoder_layer_(\d+)\.(.+)\.(weight|bias)$")
NAMES = {"ln_1": "norm1", "self_attention.in_proj": "attn.qkv",
         "self_attention.out_proj": "attn.proj", "ln_2": "norm2", "mlp.0": "mlp.fc1",
         "mlp.3": "mlp.fc2", "mlp.linear_1": "mlp.fc1", "mlp.linear_2": "mlp.fc2"}


class TorchvisionFormat(WeightFormat):
    name = FORMAT
    marks = ("conv_proj.weight", "encoder.pos_embedding")

    def convert(self, state_dict, metadata) -> ConvertedWeights:
        params = dict(state_dict)
        out = {"stem.proj.weight": params.pop("conv_proj.weight"),
               "stem.proj.bias": params.pop("conv_proj.bias"),
               "cls_token": params.pop("class_token"),
               "encoder.pos_embed.weight": params.pop("encoder.pos_embedding")}
        for key in list(params):
            # the in-projection is named in_proj_weight, not in_proj.weight
            match = BLOCK.match(key.replace("in_proj_", "in_proj."))
            if match and match.group(2) in NAMES:
                i, name, kind = match.groups()
                out[f"encoder.blocks.{i}.{NAMES[name]}.{kind}"] = params.pop(key)
        for kind in ("weight", "bias"):
            out[f"encoder.norm.{kind}"] = params.pop(f"encoder.ln.{kind}")
        config: dict = {"act": "gelu", "norm_eps": 1e-6, "pool": "token"}
        take_head(params, out, config, pre_logits="heads.pre_logits", classifier="heads.head")
        grid = square_grid(out["encoder.pos_embed.weight"].shape[1] - 1, FORMAT)
        return ConvertedWeights(FORMAT, {**out, **params}, config, grid)

    def hints(self, metadata) -> dict:
        return {"mean": MEAN, "std": STD}
