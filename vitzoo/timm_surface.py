"""What a timm user reaches for on a ViT, with timm's names and meaning: intermediate features
(`forward_intermediates`), the preprocessing timm's data helpers read (`pretrained_cfg`), the
classifier, and the groups of layer-wise learning-rate decay (`group_matcher`)."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

OUTPUT_FORMATS = ("NCHW", "NLC")


def take_indices(blocks: int, indices: int | Sequence[int] | None) -> list[int]:
    """The blocks to take, as timm counts them: None all, an int n the last n, a sequence those
    (negative from the end)."""
    if isinstance(indices, int) and not 0 < indices <= blocks:
        raise ValueError(f"indices={indices}: take the last 1 to {blocks} blocks, or list them")
    if indices is None or isinstance(indices, int):
        return list(range(blocks - (indices or blocks), blocks))
    taken = [i + blocks if i < 0 else i for i in indices]
    if any(not 0 <= i < blocks for i in taken):
        raise ValueError(f"indices={list(indices)}: the model has blocks 0 to {blocks - 1} "
                         f"(or -1 to -{blocks})")
    return taken


class TimmSurface:
    """Methods and attributes a timm VisionTransformer has, on vitzoo's model."""

    def forward_intermediates(self, x: torch.Tensor, indices: int | Sequence[int] | None = None,
                              return_prefix_tokens: bool = False, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW",
                              intermediates_only: bool = False):
        """The tokens after the blocks `indices`, as (B, D, h, w) maps ("NCHW") or (B, h * w, D)
        ("NLC"), the class token apart (`return_prefix_tokens`: (features, prefix) pairs); `norm`
        applies the final LayerNorm to each. Returns (the final normed tokens, the intermediates),
        or the intermediates alone; `stop_early` runs no block after the last one taken."""
        if output_fmt not in OUTPUT_FORMATS:
            raise ValueError(f"output_fmt={output_fmt!r} is not one of {OUTPUT_FORMATS}")
        taken = take_indices(len(self.encoder.blocks), indices)
        tokens, (h, w) = self.embed(x)
        outputs: list[torch.Tensor] = []
        until = max(taken) if stop_early else None
        final = self.encoder(tokens, (h, w), layer_outputs=outputs, until=until)
        prefix = self.num_prefix_tokens
        chosen = [self.encoder.norm(outputs[i]) if norm else outputs[i] for i in taken]
        spatial = [t[:, prefix:] for t in chosen]
        if output_fmt == "NCHW":
            spatial = [t.reshape(t.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()
                       for t in spatial]
        if return_prefix_tokens and prefix:
            spatial = list(zip(spatial, [t[:, :prefix] for t in chosen]))
        return spatial if intermediates_only else (final, spatial)

    @property
    def feature_info(self) -> list[dict[str, Any]]:
        """Per block, as timm's ViT: the module, its channels (D), its pixels per token."""
        sh, sw = self.stride
        return [{"module": f"encoder.blocks.{i}", "num_chs": self.config.embed_dim,
                 "reduction": sh if sh == sw else (sh, sw)}
                for i in range(len(self.encoder.blocks))]

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop what the blocks `indices` do not need, in place, as timm's ViT does: the later
        blocks, the final LayerNorm (`prune_norm`), fc_norm and the head (`prune_head`). Returns
        the indices from the first block."""
        taken = take_indices(len(self.encoder.blocks), indices)
        kept = max(taken) + 1
        self.encoder.blocks = self.encoder.blocks[:kept]
        if isinstance(self.encoder.pos_embed, nn.ModuleList):  # one embedding per layer
            self.encoder.pos_embed = self.encoder.pos_embed[:kept]
        if prune_norm:
            self.encoder.norm = nn.Identity()
        if prune_head:
            self.fc_norm = None
            self.reset_classifier(0, head="linear")
        self.config = self.config.replace(depth=kept)
        return taken

    def check_describable(self, action: str) -> None:
        # one LayerNorm, before the pool or after it (fc_norm), is what every config describes
        if isinstance(self.encoder.norm, nn.Identity) == (self.fc_norm is None):
            raise ValueError(f"cannot {action} this model: prune_intermediate_layers removed a "
                             "LayerNorm no config describes; save the model before pruning it")

    @property
    def num_features(self) -> int:
        return self.config.embed_dim

    embed_dim = num_features

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """The preprocessing the weights expect, as `timm.data.resolve_data_config` reads it."""
        config, tag = self.config, self.pretrained_tag
        return {"input_size": (config.in_chans, *config.img_size),
                "interpolation": config.interpolation, "crop_pct": config.crop_pct,
                "crop_mode": "center", "mean": tuple(config.mean), "std": tuple(config.std),
                "num_classes": config.num_classes,
                "first_conv": "stem.proj" if config.stem == "patch" else "stem",
                "classifier": "head.fc",
                **({"tag": tag.tag, "hf_hub_id": tag.hub_id} if tag is not None else {})}

    def get_classifier(self) -> nn.Module:  # nn.Identity with no classes
        return getattr(self.head, "fc", self.head)

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups by depth, for timm's layer-wise learning-rate decay: the embedding
        first, each block, the final norm last (the head is what is left)."""
        blocks = r"^encoder\.blocks\.(\d+)"
        return {"stem": r"^cls_token|^stem|^encoder\.pos_embed",
                "blocks": blocks if coarse else [(blocks, None), (r"^encoder\.norm", (99999,))]}
