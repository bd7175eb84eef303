"""Images are read by their range or refused: a 16-bit PNG, a 32-bit or float TIFF is read as its
8-bit picture is; one with no range to read it by, or over Pillow's limit, is refused naming the
file; integer tensors are refused by the model and its inference form alike."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hub_testing import tiny  # tests/hub_testing.py
from PIL import Image

from vitzoo import transforms_for
from vitzoo.commands.predict import predict, read_image

# from 0 to 1 across the image along both axes: every pixel value matters
GRADIENT = 0.8 * np.linspace(0, 1, 64)[None, :] + 0.2 * np.linspace(0, 1, 48)[:, None]


def saved(path, array) -> str:
    Image.fromarray(array).save(path)
    return str(path)


def test_predict_reads_high_bit_depth_images_by_their_range(tmp_path):
    model = tiny()
    labels = [f"class {i}" for i in range(model.config.num_classes)]
    eight = saved(tmp_path / "g8.png", np.round(GRADIENT * 255).astype(np.uint8))
    reference, expected = transforms_for(model)(read_image(eight)), predict(model, labels,
                                                                            [eight], 5)[0]["top"]
    for path in (saved(tmp_path / "g16.png", np.round(GRADIENT * 65535).astype(np.uint16)),
                 saved(tmp_path / "g32.tif", np.round(GRADIENT * (2**31 - 1)).astype(np.int32)),
                 saved(tmp_path / "gf.tif", GRADIENT.astype(np.float32))):
        assert (transforms_for(model)(read_image(path)) - reference).abs().max() < 0.03, path
        top = predict(model, labels, [path], 5)[0]["top"]
        assert [t["index"] for t in top] == [t["index"] for t in expected], path
        assert [t["probability"] for t in top] == pytest.approx(
            [t["probability"] for t in expected], abs=0.02), path


@pytest.mark.parametrize("array", [(GRADIENT * 4000).astype(np.float32),
                                   np.where(GRADIENT > 0.5, np.nan, GRADIENT).astype(np.float32),
                                   np.round((GRADIENT - 0.5) * 1000).astype(np.int32)],
                         ids=["float outside [0, 1]", "float NaN", "negative integers"])
def test_an_image_with_no_range_to_read_it_by_is_refused(tmp_path, array):
    path = saved(tmp_path / "x.tif", array)
    with pytest.raises(ValueError, match=rf"cannot read image '{re.escape(path)}' correctly: "
                                         r".*(rescale|save it)"):
        read_image(path)


def test_a_huge_image_is_not_called_damaged(tmp_path, monkeypatch):
    path = saved(tmp_path / "big.png", np.zeros((64, 64, 3), np.uint8))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ValueError, match="larger than Pillow reads by default") as err:
        read_image(path)
    assert "damaged" not in str(err.value)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.bool])
@pytest.mark.parametrize("inference_dtype", [torch.float32, torch.bfloat16])
def test_the_fast_path_refuses_integer_images_as_the_model_does(dtype, inference_dtype):
    from vitzoo.inference import for_inference

    model = tiny()
    x = torch.randint(0, 2 if dtype is torch.bool else 255, (2, 3, 32, 32)).to(dtype)
    with pytest.raises(ValueError, match="expected floating-point images") as plain:
        model(x)
    fast = for_inference(model, inference_dtype)
    with pytest.raises(ValueError) as refused:
        fast(x)
    assert str(refused.value) == str(plain.value)
    assert fast(torch.rand(2, 3, 32, 32, dtype=torch.float64)).dtype == inference_dtype
