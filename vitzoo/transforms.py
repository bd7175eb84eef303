"""The preprocessing the weights expect, as a torchvision transforms v2 pipeline.

Everything comes from the model's config, which a pretrained tag (or the metadata beside foreign
weights) fills: resize the shorter side to img_size / crop_pct, take the centre img_size crop,
scale to [0, 1] floats and normalise with mean and std. crop_pct 1.0 (the paper's fine-tuned
weights at 384 px) resizes straight to img_size; timm's 224 px weights crop 0.9.
"""

from __future__ import annotations

import math

from vitzoo.config import ViTConfig


def transforms_for(model_or_config, *, is_training: bool = False):
    """`torchvision.transforms.v2.Compose` for a VisionTransformer, a ViTConfig, or a model or tag name
    (`"vit_s16.augreg_in21k_ft_in1k"`: its weights' preprocessing): PIL images or uint8 tensors (C, H, W)
    in, normalised float tensors of the model's input size out. `is_training`: the training
    augmentation instead of the evaluation crop (a random-resized crop of the input size, scale 0.08 to
    1, and a horizontal flip: the paper's and timm's default), then the same scaling and normalisation."""
    import torch
    from torchvision.transforms import v2

    if isinstance(model_or_config, str):
        from vitzoo.catalog import config_of

        model_or_config = config_of(model_or_config)
    config: ViTConfig = model_or_config if isinstance(model_or_config, ViTConfig) else model_or_config.config
    height, width = config.img_size
    interpolation = v2.InterpolationMode(config.interpolation)
    # a PIL image is resized as a PIL image (ToImage after the geometry), as timm's transforms do: the
    # same pixels as timm's, where resizing the tensor differs by rounding
    # a one-channel model (Fashion-MNIST's) takes the image's luma: predict reads every image as RGB
    gray = [v2.Grayscale(num_output_channels=1)] if config.in_chans == 1 else []
    normalise = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), *gray,
                 v2.Normalize(mean=list(config.mean), std=list(config.std))]
    if is_training:
        return v2.Compose([v2.RandomResizedCrop((height, width), scale=(0.08, 1.0), interpolation=interpolation,
                                                antialias=True), v2.RandomHorizontalFlip(), *normalise])
    # as timm: floor(size / crop_pct); a square input resizes the shorter side and keeps the aspect ratio
    scaled = (math.floor(height / config.crop_pct), math.floor(width / config.crop_pct))
    return v2.Compose([
        v2.Resize(scaled[0] if height == width else scaled, interpolation=interpolation, antialias=True),
        v2.CenterCrop((height, width)),
        *normalise,
    ])
