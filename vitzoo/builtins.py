"""The built-in components, named models, tags and weight formats, registered as a plugin's are."""

from __future__ import annotations

from vitzoo.hookspecs import hookimpl
from vitzoo.layers import heads, pos_embed, stems
from vitzoo.weights import native, official, timm, torchvision, transformers
from vitzoo.zoo import MODELS, PRETRAINED


@hookimpl
def vitzoo_stems():
    return {"patch": stems.PatchEmbedding, "resnet": stems.HybridEmbedding}


@hookimpl
def vitzoo_pos_embeds():
    return {"none": pos_embed.NoPosEmbed, "learned_1d": pos_embed.LearnedPosEmbed1d,
            "learned_2d": pos_embed.LearnedPosEmbed2d, "relative": pos_embed.RelativePositionBias}


@hookimpl
def vitzoo_pools():
    return {"token": heads.ClassTokenPool, "gap": heads.GlobalAveragePool}


@hookimpl
def vitzoo_heads():
    return {"linear": heads.LinearHead, "mlp": heads.MLPHead}


@hookimpl
def vitzoo_models():
    return dict(MODELS)


@hookimpl
def vitzoo_pretrained_tags():
    return {tag.name: tag for tag in PRETRAINED}


@hookimpl
def vitzoo_weight_formats():
    formats = (native.VitzooFormat(), timm.TimmFormat(), torchvision.TorchvisionFormat(),
               transformers.TransformersFormat(), official.OfficialFormat())
    return {fmt.name: fmt for fmt in formats}
