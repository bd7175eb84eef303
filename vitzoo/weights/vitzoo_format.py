"""vitzoo's own names: a bare vitzoo state dict (a model.safetensors without its config.json, say)
is a weight format like the others; a directory that save_pretrained wrote is read by
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
        return ConvertedWeights(format=FORMAT, state_dict=dict(state_dict), config={},
                                grid=grid_of(state_dict))


def grid_of(state_dict) -> tuple[int, int] | None:
    """The token grid the position embeddings were trained at, by each kind's tensors (one per block
    for pos_embed_mode="every_layer"): a 1-D one's positions, a 2-D one's rows and columns, a
    relative table's 2N - 1 offsets (plus one for the class token); None without any."""
    prefix = int("cls_token" in state_dict)
    for name in ("encoder.pos_embed.weight", "encoder.pos_embed.0.weight"):
        if (pos := state_dict.get(name)) is not None and pos.ndim == 3:
            side = square_side(pos.shape[1] - prefix)
            return (side, side) if side else None
    for name in ("encoder.pos_embed.row", "encoder.pos_embed.0.row"):
        if (row := state_dict.get(name)) is not None:
            col = state_dict.get(name.replace("row", "col"))
            return (int(row.shape[0]), int(col.shape[0])) if col is not None else None
    if (table := state_dict.get("encoder.blocks.0.attn.relative.table")) is not None:
        offsets = table.shape[0] - prefix  # 2N - 1 for N patches
        side = square_side((offsets + 1) // 2) if offsets % 2 else None
        return (side, side) if side else None
    return None
