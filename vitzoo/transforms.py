"""The preprocessing the weights expect, as a torchvision transforms v2 pipeline.

Everything comes from the model's config, which a pretrained tag (or the metadata beside foreign
weights) fills: resize the shorter side to img_size / crop_pct, take the centre img_size crop,
scale to [0, 1] floats and normalise with mean and std. crop_pct 1.0 (the paper's fine-tuned
weights at 384 px) resizes straight to img_size; timm's 224 px weights crop 0.9.
"""

from __future__ import annotations

import math

from vitzoo.config import ViTConfig


def transforms_for(model_or_config):
    """`torchvision.transforms.v2.Compose` for a VisionTransformer (or a ViTConfig): PIL images or
    uint8 tensors (C, H, W) in, normalised float tensors of the model's input size out."""
    import torch
    from torchvision.transforms import v2

    config: ViTConfig = model_or_config if isinstance(model_or_config, ViTConfig) else model_or_config.config
    height, width = config.img_size
    # as timm: floor(size / crop_pct); a square input resizes the shorter side and keeps the aspect ratio
    scaled = (math.floor(height / config.crop_pct), math.floor(width / config.crop_pct))
    interpolation = v2.InterpolationMode(config.interpolation)
    return v2.Compose([
        v2.ToImage(),
        v2.Resize(scaled[0] if height == width else scaled, interpolation=interpolation, antialias=True),
        v2.CenterCrop((height, width)),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(mean=list(config.mean), std=list(config.std)),
    ])
