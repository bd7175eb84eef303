"""Inputs that would be read wrong are refused, naming what is wrong (issue 23): weights of a kind that
is not a float where floats belong, images whose values would be clipped, integer images handed to
the fast inference path."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hub_testing import tiny  # tests/hub_testing.py
from safetensors.torch import save_file

import vitzoo
from vitzoo.errors import CheckpointError, InputError


# ------------------------------------------------------------------ 4. integer and boolean tensors where floats belong
def retyped(state_dict: dict, changes: dict) -> dict:
    out = {k: v.clone() for k, v in state_dict.items()}
    for name, dtype in changes.items():
        out[name] = (out[name] * 100).to(dtype)
    return out


CHANGES = [
    {"encoder.blocks.1.attn.qkv.weight": torch.int64},
    {"head.fc.bias": torch.int8, "stem.proj.weight": torch.int32},
    {"encoder.norm.weight": torch.bool},
]


@pytest.mark.parametrize("changes", CHANGES)
def test_integer_or_boolean_weights_in_a_bare_file_are_refused(tmp_path, changes):
    """A bare model.safetensors (or .pth) whose tensors include int64, int8, int32 or bool ones where
    the model has floats is a CheckpointError naming each such tensor and its dtype."""
    state = retyped(tiny().state_dict(), changes)
    save_file(state, str(tmp_path / "w.safetensors"))
    torch.save(state, tmp_path / "w.pth")
    for path in (tmp_path / "w.safetensors", tmp_path / "w.pth"):
        with pytest.raises(CheckpointError, match="not floating-point") as err:
            vitzoo.from_pretrained(path, num_heads=2)
        for name, dtype in changes.items():
            assert f"{name}: {str(dtype).removeprefix('torch.')}" in str(err.value)


@pytest.mark.parametrize("changes", CHANGES)
def test_integer_or_boolean_weights_in_a_saved_directory_are_refused(tmp_path, changes):
    """The same in a directory written by save_pretrained, loaded alone or under a model name."""
    tiny().save_pretrained(tmp_path / "saved")
    state = retyped(tiny().state_dict(), changes)
    save_file(state, str(tmp_path / "saved" / "model.safetensors"), metadata={"format": "pt"})
    names = "|".join(re.escape(n) for n in changes)
    with pytest.raises(CheckpointError, match=rf"(?s)not floating-point.*({names})"):
        vitzoo.from_pretrained(tmp_path / "saved")
    with pytest.raises(CheckpointError, match="not floating-point"):
        vitzoo.create("vit_b16", pretrained=tmp_path / "saved")


def test_float64_and_half_weights_still_load(tmp_path):
    """Floating-point weights of another precision (float64, float16, bfloat16) are floats: they load,
    cast to the model's dtype, as before."""
    model = tiny()
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        save_file({k: v.to(dtype) for k, v in model.state_dict().items()}, str(tmp_path / "w.safetensors"))
        loaded = vitzoo.from_pretrained(tmp_path / "w.safetensors", num_heads=2)
        assert all(v.dtype == torch.float32 for v in loaded.state_dict().values())


def test_integer_weights_are_not_loaded_with_strict_false(tmp_path, caplog):
    """strict=False loads what fits: an integer tensor does not fit a float parameter, so it is left at
    its init and named in the warning, never cast in."""
    import logging

    model = tiny()
    state = retyped(model.state_dict(), {"head.fc.weight": torch.int64})
    save_file(state, str(tmp_path / "w.safetensors"))
    with caplog.at_level(logging.WARNING, logger="vitzoo"):
        loaded = vitzoo.create("vit_b16", pretrained=tmp_path / "w.safetensors", strict=False, embed_dim=32, depth=2,
                               num_heads=2, mlp_dim=64, img_size=32, patch_size=8, num_classes=5)
    assert "head.fc.weight" in caplog.text
    assert not torch.equal(loaded.head.fc.weight, state["head.fc.weight"].float())
    assert torch.equal(loaded.head.fc.bias, model.head.fc.bias)


# ------------------------------------------------------------------ 5. images of more than 8 bits
def gradient(height: int = 48, width: int = 64) -> np.ndarray:
    """Values from 0 to 1 across the image, along both axes: every pixel value matters."""
    return 0.8 * np.linspace(0.0, 1.0, width)[None, :] + 0.2 * np.linspace(0.0, 1.0, height)[:, None]


def save(path, array, **options):
    from PIL import Image

    Image.fromarray(array).save(path, **options)
    return str(path)


@pytest.fixture
def labelled():
    model = tiny()
    return model, [f"class {i}" for i in range(model.config.num_classes)]


def high_bit_depth_images(tmp_path) -> dict[str, str]:
    g = gradient()
    return {
        "16-bit PNG": save(tmp_path / "g16.png", np.round(g * 65535).astype(np.uint16)),
        "32-bit integer TIFF": save(tmp_path / "g32.tif", np.round(g * (2**31 - 1)).astype(np.int32)),
        "float TIFF in [0, 1]": save(tmp_path / "gf.tif", g.astype(np.float32)),
    }


def test_predict_reads_high_bit_depth_images_by_their_range(tmp_path, labelled):
    """A 16-bit PNG, a 32-bit integer TIFF and a float TIFF in [0, 1] are preprocessed as the 8-bit
    image of the same picture is (within 8-bit rounding), not clipped to white or black, and predict
    the same classes."""
    from vitzoo.commands.predict import predict, read_image
    from vitzoo.transforms import transforms_for

    model, labels = labelled
    transform = transforms_for(model)
    eight = save(tmp_path / "g8.png", np.round(gradient() * 255).astype(np.uint8))
    reference = transform(read_image(eight))
    expected = predict(model, labels, [eight], 5)[0]["top"]
    for kind, path in high_bit_depth_images(tmp_path).items():
        x = transform(read_image(path))
        assert x.shape == reference.shape and (x - reference).abs().max() < 0.03, kind
        top = predict(model, labels, [path], 5)[0]["top"]
        assert [t["index"] for t in top] == [t["index"] for t in expected], kind
        assert [t["probability"] for t in top] == pytest.approx([t["probability"] for t in expected], abs=0.02), kind


@pytest.mark.parametrize("kind", ["float TIFF outside [0, 1]", "float TIFF with NaN", "negative 32-bit TIFF"])
def test_predict_refuses_images_it_cannot_read_correctly(tmp_path, kind):
    """A float image outside [0, 1] or with NaNs, or an integer image with negative values, has no range
    to read it by: a ValueError naming the file, what it holds and what to do."""
    from vitzoo.commands.predict import read_image

    g = gradient()
    array = {"float TIFF outside [0, 1]": (g * 4000).astype(np.float32),
             "float TIFF with NaN": np.where(g > 0.5, np.nan, g).astype(np.float32),
             "negative 32-bit TIFF": np.round((g - 0.5) * 1000).astype(np.int32)}[kind]
    path = save(tmp_path / "x.tif", array)
    with pytest.raises(ValueError, match=rf"cannot read image '{re.escape(path)}' correctly: .*(rescale|save it)"):
        read_image(path)


def test_a_huge_image_is_not_called_damaged(tmp_path, monkeypatch):
    """An image over Pillow's decompression-bomb limit is said to be too large, not damaged."""
    from PIL import Image

    from vitzoo.commands.predict import read_image

    path = save(tmp_path / "big.png", np.zeros((64, 64, 3), np.uint8))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ValueError, match="larger than Pillow reads by default") as err:
        read_image(path)
    assert "damaged" not in str(err.value)


# ------------------------------------------------------------------ 6. the fast path refuses what the model refuses
@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool, torch.int32])
@pytest.mark.parametrize("inference_dtype", [torch.float32, torch.bfloat16])
def test_the_fast_path_refuses_integer_images_as_the_model_does(dtype, inference_dtype):
    """for_inference(model, dtype) given uint8, int64, int32 or bool images raises the plain model's
    InputError ("expected floating-point images", with how to convert), instead of casting them."""
    from vitzoo.inference import for_inference

    model = tiny()
    x = torch.randint(0, 2 if dtype is torch.bool else 255, (2, 3, 32, 32)).to(dtype)
    with pytest.raises(InputError) as plain:
        model(x)
    fast = for_inference(model, inference_dtype)
    with pytest.raises(InputError) as refused:
        fast(x)
    assert "expected floating-point images" in str(refused.value) and str(refused.value) == str(plain.value)
    assert fast(torch.rand(2, 3, 32, 32, dtype=torch.float64)).dtype == inference_dtype  # floats are cast
