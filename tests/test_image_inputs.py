"""Images are read by their range or refused: a 16-bit PNG, a 32-bit or float TIFF is read as its
8-bit picture is; an image with no range to read it by, one over Pillow's limit, a directory are
refused naming the file; integer tensors are refused by the model and its inference form alike."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hub_testing import tiny  # tests/hub_testing.py

from vitzoo.cli import main
from vitzoo.errors import InputError


def gradient(height: int = 48, width: int = 64) -> np.ndarray:
    """Values from 0 to 1 across the image, along both axes: every pixel value matters."""
    return 0.8 * np.linspace(0.0, 1.0, width)[None, :] + 0.2 * np.linspace(0.0,
                                                                           1.0, height)[:, None]


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
        "32-bit integer TIFF": save(tmp_path / "g32.tif",
                                    np.round(g * (2**31 - 1)).astype(np.int32)),
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


@pytest.mark.parametrize("kind",
                         ["float TIFF outside [0, 1]", "float TIFF with NaN",
                          "negative 32-bit TIFF"])
def test_predict_refuses_images_it_cannot_read_correctly(tmp_path, kind):
    """A float image outside [0, 1] or with NaNs, or an integer image with negative values, has no
    range to read it by: a ValueError naming the file, what it holds and what to do."""
    from vitzoo.commands.predict import read_image

    g = gradient()
    array = {"float TIFF outside [0, 1]": (g * 4000).astype(np.float32),
             "float TIFF with NaN": np.where(g > 0.5, np.nan, g).astype(np.float32),
             "negative 32-bit TIFF": np.round((g - 0.5) * 1000).astype(np.int32)}[kind]
    path = save(tmp_path / "x.tif", array)
    with pytest.raises(ValueError,
                       match=rf"cannot read image '{re.escape(path)}' correctly: .*(rescale|save it)"):
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


def test_predict_names_a_directory_as_a_directory(tmp_path, capsys):
    assert main(["predict", str(tmp_path), "--model", "vit_ti16.augreg_in21k_ft_in1k"]) == 2
    assert "it is a directory, not an image file" in capsys.readouterr().err


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
    assert "expected floating-point images" in str(refused.value)
    assert str(refused.value) == str(plain.value)
    assert fast(torch.rand(2, 3, 32, 32,
                           dtype=torch.float64)).dtype == inference_dtype  # floats are cast
