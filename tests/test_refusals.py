"""Inputs that would be read wrong are refused, naming what is wrong (issue 23): weights of a kind that
is not a float where floats belong, images whose values would be clipped, integer images handed to
the fast inference path."""

from __future__ import annotations

import re

import pytest
import torch
from hub_testing import tiny  # tests/hub_testing.py
from safetensors.torch import save_file

import vitzoo
from vitzoo.errors import CheckpointError


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
