"""The preprocessing the weights expect, as a torchvision transforms v2 pipeline, from the model's
config (which a pretrained tag, or the metadata beside foreign weights, fills)."""

from __future__ import annotations

from vitzoo.config import ViTConfig
from vitzoo.tags import preprocessing


def transforms_for(model_or_config, *, is_training: bool = False):
    """`torchvision.transforms.v2.Compose` for a VisionTransformer, a ViTConfig, or a model or tag
    name (`"vit_s16.augreg_in21k_ft_in1k"`: its weights' preprocessing): PIL images or uint8
    tensors (C, H, W) in, normalised float tensors of the model's input size out. `is_training`:
    the training augmentation instead of the evaluation crop (`vitzoo.tags.preprocessing`)."""
    if isinstance(model_or_config, str):
        from vitzoo.catalog import config_of

        model_or_config = config_of(model_or_config)
    config: ViTConfig = (model_or_config if isinstance(model_or_config, ViTConfig)
                         else model_or_config.config)
    return preprocessing(config.img_size, config.crop_pct, config.interpolation, config.mean,
                         config.std, in_chans=config.in_chans, is_training=is_training)
