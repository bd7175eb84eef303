"""The functions a timm user reaches for take the argument they would pass: a model where a config
is asked for, a tag's name where a model is, and a model pickles like any module."""

import io
import pickle

import pytest
import torch

import vitzoo


def test_count_flops_takes_a_model_a_config_or_a_name():
    model = vitzoo.create("vit_ti16", num_classes=10, img_size=32, patch_size=8)
    assert vitzoo.count_flops(model) == vitzoo.count_flops(model.config) > 0
    assert vitzoo.count_flops("vit_s16") == vitzoo.count_flops(vitzoo.get_config("vit_s16"))


def test_transforms_for_a_tag_name_are_the_tag_s_preprocessing():
    # its architecture and preprocessing, no weights
    tag = vitzoo.create("vit_s16.augreg_in21k_ft_in1k")
    by_name = vitzoo.transforms_for("vit_s16.augreg_in21k_ft_in1k")
    image = torch.randint(0, 256, (3, 300, 260), dtype=torch.uint8)
    assert torch.equal(by_name(image), vitzoo.transforms_for(tag)(image))
    assert tag.config.crop_pct == 0.9 and "Resize(size=[248]" in repr(by_name)  # 224 / 0.9
    white = torch.full((3, 300, 400), 255, dtype=torch.uint8)
    torch.testing.assert_close(by_name(white), torch.ones(3, 224, 224))  # (1 - 0.5) / 0.5
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    config = vitzoo.get_config("vit_b16", mean=mean, std=std, img_size=(64, 96))
    out = vitzoo.transforms_for(config)(torch.zeros(3, 50, 70, dtype=torch.uint8))
    assert out.shape == (3, 64, 96)
    torch.testing.assert_close(out[:, 0, 0], -torch.tensor(mean) / torch.tensor(std))


def test_training_transforms_crop_at_random_and_give_the_input_size():
    model = vitzoo.create("vit_ti16", img_size=32, patch_size=8)
    train = vitzoo.transforms_for(model, is_training=True)
    image = torch.randint(0, 256, (3, 64, 48), dtype=torch.uint8)
    torch.manual_seed(0)
    first, second = train(image), train(image)
    assert first.shape == second.shape == (3, 32, 32) and first.dtype == torch.float32
    assert not torch.equal(first, second)  # a random-resized crop and a flip, drawn anew each call
    evaluation = vitzoo.transforms_for(model)
    assert torch.equal(evaluation(image), evaluation(image))


def test_list_models_with_pretrained_lists_the_tags_as_timm_does():
    tags = vitzoo.list_models("vit_s16", pretrained=True)
    assert tags and all(name.startswith("vit_s16.") for name in tags)
    assert set(tags) == set(vitzoo.list_pretrained("vit_s16.*"))
    assert "vit_s16" in vitzoo.list_models("vit_s16")  # without it: the architectures


def test_a_model_pickles_and_saves_whole_with_torch_save():
    model = vitzoo.create("vit_ti16", num_classes=4, img_size=32, patch_size=8,
                          act="gelu_tanh").eval()
    x = torch.randn(2, 3, 32, 32)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    copied = pickle.loads(pickle.dumps(model))
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x)) and torch.equal(copied(x), model(x))


def test_a_name_or_weights_of_another_type_is_refused_naming_what_each_can_be():
    with pytest.raises(TypeError, match="a model's name is a str"):
        vitzoo.create(3)
    for call in (lambda: vitzoo.create("vit_b16", pretrained=3),
                 lambda: vitzoo.from_pretrained(3.5)):
        with pytest.raises(TypeError, match="weights are a path, 'hf-hub:ORG/NAME', a state dict"):
            call()
