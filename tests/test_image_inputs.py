"""Images are read as 8-bit RGB or refused naming the file: one of more bits (which converting
would clip) or over Pillow's limit; integer tensors are refused by the model and its inference
form alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hub_testing import tiny  # tests/hub_testing.py
from PIL import Image

from vitzoo.commands.predict import read_image


@pytest.mark.parametrize("array, name", [(np.zeros((8, 8), np.uint16), "x.png"),
                                         (np.zeros((8, 8), np.float32), "x.tif")])
def test_an_image_of_more_than_8_bits_is_refused_naming_the_file(tmp_path, array, name):
    Image.fromarray(array).save(tmp_path / name)
    with pytest.raises(ValueError, match=f"cannot read image '{tmp_path / name}'.*8-bit"):
        read_image(str(tmp_path / name))


def test_a_huge_image_is_refused_with_pillows_reason(tmp_path, monkeypatch):
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ValueError, match="cannot read image .*big.png.*exceeds limit"):
        read_image(str(tmp_path / "big.png"))


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
