"""vitzoo's own names: a bare vitzoo state dict (a model.safetensors without its config.json, say) is a
weight format like the others; a directory that save_pretrained wrote is read by
`vitzoo.checkpoints.native`, whose config.json names this format."""

from __future__ import annotations

from vitzoo.weights.converted import ConvertedWeights
from vitzoo.weights.formats import Metadata, WeightFormat
from vitzoo.weights.layout import square_side

FORMAT = "vitzoo"


class VitzooFormat(WeightFormat):
    """A bare vitzoo state dict (e.g. a model.safetensors without its config.json)."""

    name = FORMAT

    def recognises(self, keys, metadata: Metadata) -> bool:
        return "stem.proj.weight" in keys and any(k.startswith("encoder.") for k in keys)

    def convert(self, state_dict, metadata: Metadata) -> ConvertedWeights:
        pos = state_dict.get("encoder.pos_embed.weight")
        side = square_side(pos.shape[1] - int("cls_token" in state_dict)) if pos is not None else None
        return ConvertedWeights(format=FORMAT, state_dict=dict(state_dict), config={}, grid=(side, side) if side else None)
