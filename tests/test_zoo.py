"""The zoo: every named model of the paper, with the official parameter counts exactly (which pin
each hybrid's ResNet, its patch size 1 on the ResNet's map and so its token grid)."""

import pytest
import torch

import vitzoo
from vitzoo.registry import pretrained_tags
from vitzoo.zoo import imagenet_1k

# Official counts at 224 px with 1000 classes (reference file; the official repository's test).
OFFICIAL_PARAMS = {
    "vit_ti16": 5_717_416,
    "vit_s16": 22_050_664,
    "vit_s32": 22_878_952,
    "vit_b8": 86_576_872,
    "vit_b16": 86_567_656,
    "vit_b32": 88_224_232,
    "vit_l16": 304_326_632,
    "vit_l32": 306_535_400,
    "vit_h14": 632_045_800,
    "vit_b16_hybrid": 98_659_112,  # R50+ViT-B_16
    "vit_l32_hybrid": 328_994_856,  # R50+ViT-L_32
    "vit_b32_r26_hybrid": 101_383_976,  # R26+ViT-B_32
    "vit_s32_r26_hybrid": 36_431_912,  # R26+ViT-S_32
}


def test_the_zoo_has_every_model_of_the_paper():
    assert set(vitzoo.list_models()) >= set(OFFICIAL_PARAMS) | {"vit_b32_hybrid", "vit_l16_hybrid"}
    assert vitzoo.list_models("vit_l*") == ["vit_l16", "vit_l16_hybrid", "vit_l32",
                                            "vit_l32_hybrid"]


@pytest.mark.parametrize("name, expected", sorted(OFFICIAL_PARAMS.items()))
def test_parameter_count_equals_the_official_one(name, expected):
    model = vitzoo.create(name, device="meta")  # no memory allocated, even for H/14
    assert vitzoo.count_params(model) == expected


def test_a_root_only_hybrid_and_depth_zero_run():
    """The ResNet root alone has stride 4; depth 0 is the ResNet baseline of Figure 5: the
    hybrid's ResNet, pooled, with no Transformer layer."""
    root = vitzoo.create("vit_ti16", stem="resnet", stem_options={"layers": ()}, patch_size=2,
                         img_size=32, num_classes=3)
    assert root.stride == (8, 8) and root(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    resnet = vitzoo.create("vit_ti16", stem="resnet", stem_options={"layers": (1,)}, patch_size=1,
                           depth=0, pos_embed="none", pool="gap", img_size=32, num_classes=3)
    assert len(resnet.encoder.blocks) == 0 and resnet(torch.randn(2, 3, 32, 32)).shape == (2, 3)


@pytest.mark.parametrize("name", ["vit_ti16", "vit_s32"])
def test_named_models_run_at_their_resolution(name):
    with torch.inference_mode():
        model = vitzoo.create(name, num_classes=4).eval()
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 4)


@pytest.mark.parametrize("name, fields", [
    ("vit_b32_hybrid", dict(hidden_size=768, num_layers=12, mlp_dim=3072, num_heads=12,
                            resnet_layers=(3, 4, 6, 3))),
    ("vit_l16_hybrid", dict(hidden_size=1024, num_layers=24, mlp_dim=4096, num_heads=16,
                            resnet_layers=(3, 4, 9)))])
def test_hybrids_without_an_official_count_count_as_the_official_code_builds_them(name, fields):
    """R50+B/32 and R50+L/16 (Table 6): the independent Flax model counts them."""
    from official_reference import official_param_count

    expected = official_param_count(224, patch_size=1, num_classes=1000, classifier="token",
                                    **fields)
    assert vitzoo.count_params(vitzoo.create(name, device="meta")) == expected


@pytest.mark.parametrize("timm_name, name, img_size", [
    ("vit_tiny_patch16_224", "vit_ti16", 224), ("vit_base_patch16_384", "vit_b16", 384),
    ("vit_large_patch32_224", "vit_l32", 224), ("vit_base_r50_s16_224", "vit_b16_hybrid", 224),
    ("vit_small_r26_s32_224", "vit_s32_r26_hybrid", 224)])
def test_timms_name_of_a_paper_model_builds_that_model(timm_name, name, img_size):
    model = vitzoo.create(timm_name, device="meta")
    assert model.config == vitzoo.get_config(name, img_size=img_size) == \
        vitzoo.get_config(timm_name)


def test_the_zoo_releases_46_tags_and_marks_one_default_for_each_of_their_12_models():
    tags = pretrained_tags().values()
    models = {tag.model for tag in tags}
    assert len(tags) == 46 and sorted(t.model for t in tags if t.default) == sorted(models)
    paper = {"vit_b16", "vit_b32", "vit_l16", "vit_l32", "vit_h14", "vit_b16_hybrid"}
    assert {t.model for t in tags if t.tag.startswith("orig_")} == paper and len(models) == 12
    default = pretrained_tags()["vit_b16.orig_in21k_ft_in1k"]
    assert (default.default, default.img_size, default.accuracy) == (True, 384, 83.97)
    assert all(tag.accuracy is None or tag.accuracy_source for tag in tags)


def test_a_tag_carries_its_repo_preprocessing_class_names_and_accuracy():
    """As torchvision's Weights: the tag's transforms are those `transforms_for` gives its name."""
    tag = pretrained_tags()["vit_b32.orig_in21k_ft_in1k"]
    assert (tag.hub_id, tag.format, tag.img_size, tag.accuracy) == (
        "google/vit-base-patch32-384", "transformers", 384, 81.28)
    image = torch.randint(0, 256, (3, 300, 260), dtype=torch.uint8)
    for name in (tag.name, "vit_b16.orig_in21k_ft_in1k_224"):
        torch.testing.assert_close(pretrained_tags()[name].transforms()(image),
                                   vitzoo.transforms_for(name)(image))
    assert tag.categories() == imagenet_1k()
    assert pretrained_tags()["vit_b16.orig_in21k"].categories() is None
