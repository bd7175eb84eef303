"""Weights that do not load as they are are refused naming the file, the tensor and the cause: a
mis-shaped tensor, integers where floats belong, bytes of another format than the file's name says,
a timm ViT of another form than the paper's. No error prints a tensor."""

from __future__ import annotations

import os
import re

import pytest
import torch
from hub_testing import tiny  # tests/hub_testing.py
from safetensors.torch import save_file

import vitzoo
from vitzoo.errors import CheckpointError


@pytest.mark.parametrize("name, shape", [("encoder.blocks.0.mlp.fc1.weight", (96, 32)),
                                         ("encoder.blocks.1.mlp.fc1.weight", (48, 32)),
                                         ("encoder.blocks.0.mlp.fc1.bias", (80,))])
def test_the_one_mis_shaped_tensor_is_named(tmp_path, name, shape):
    """A bare state dict with one tensor of the wrong shape, loaded with the model inferred from its
    shapes: the error names that tensor, and no tensor that fits."""
    state = {k: v.clone() for k, v in tiny().state_dict().items()}
    state[name] = torch.zeros(shape)
    save_file(state, str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match="mis-shaped \\(1\\)") as err:
        vitzoo.from_pretrained(tmp_path / "w.safetensors", num_heads=2)
    assert name in str(err.value)


@pytest.mark.parametrize("content", [b"", os.urandom(1000), b"\x00" * 64, b"hello, not weights"])
def test_a_garbage_torch_file_is_not_said_to_hold_python_objects(tmp_path, content):
    (tmp_path / "w.pth").write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        vitzoo.from_pretrained(tmp_path / "w.pth")
    assert "Python objects" not in str(err.value)
    assert "is not a torch checkpoint" in str(err.value) or "damaged" in str(err.value)


def test_a_torch_file_of_python_objects_still_says_so(tmp_path):
    torch.save({"model": tiny().state_dict(),
                "optimizer_class": torch.optim.SGD}, tmp_path / "w.pth")
    with pytest.raises(CheckpointError, match="holds Python objects besides tensors"):
        vitzoo.from_pretrained(tmp_path / "w.pth")


def test_a_torch_save_file_named_safetensors_is_said_to_be_one(tmp_path):
    model = tiny()
    for zipped in (True, False):
        path = tmp_path / f"weights{zipped}.safetensors"
        torch.save(model.state_dict(), path, _use_new_zipfile_serialization=zipped)
        with pytest.raises(vitzoo.CheckpointError,
                           match="is not a safetensors file: its bytes are a (zip archive of "
                                 "pickles|pickle)"):
            vitzoo.from_pretrained(path)
        path.rename(path.with_suffix(".pth"))  # as the error says: then it reads
        assert vitzoo.from_pretrained(path.with_suffix(".pth"), num_heads=2).config.embed_dim == 32
    (tmp_path / "cut.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"")
    with pytest.raises(vitzoo.CheckpointError, match="damaged or truncated"):
        vitzoo.from_pretrained(tmp_path / "cut.safetensors")


def test_an_unreadable_weights_file_is_not_called_damaged(tmp_path):
    """A weights file the system will not read (here: a directory where the file belongs) is
    reported with the system's reason, not as damaged."""
    from vitzoo.errors import CheckpointError

    tiny().save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "model.safetensors").unlink()
    (tmp_path / "saved" / "model.safetensors").mkdir()
    with pytest.raises(CheckpointError, match="cannot read .*model.safetensors") as err:
        vitzoo.from_pretrained(tmp_path / "saved")
    assert "damaged" not in str(err.value)


@pytest.mark.parametrize("model, options, fragment", [
    ("vit_tiny_patch16_224", dict(reg_tokens=4), "register tokens"),
    ("vit_tiny_patch16_224", dict(no_embed_class=True), "no_embed_class"),
    ("deit_tiny_distilled_patch16_224", {}, "distillation token"),
])
def test_timm_weights_of_another_form_than_the_papers_are_said_to_be_so(
        tmp_path, model, options, fragment):
    """Register tokens, DeiT's distillation token and no_embed_class are named, not taken for a
    damaged (not square) position-embedding grid."""
    timm = pytest.importorskip("timm")
    reference = timm.create_model(model, pretrained=False, img_size=32, patch_size=8, **options)
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()},
              str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match="not a ViT of the paper's form") as err:
        vitzoo.from_pretrained(tmp_path / "w.safetensors")
    assert fragment in str(err.value) and "square grid" not in str(err.value)


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
    """A bare model.safetensors (or .pth) whose tensors include int64, int8, int32 or bool ones
    where the model has floats is a CheckpointError naming each such tensor and its dtype."""
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


def test_integer_weights_are_not_loaded_with_strict_false(tmp_path, caplog):
    """strict=False loads what fits: an integer tensor does not fit a float parameter, so it is left
    at its init and named in the warning, never cast in."""
    import logging

    model = tiny()
    state = retyped(model.state_dict(), {"head.fc.weight": torch.int64})
    save_file(state, str(tmp_path / "w.safetensors"))
    with caplog.at_level(logging.WARNING, logger="vitzoo"):
        loaded = vitzoo.create("vit_b16", pretrained=tmp_path / "w.safetensors", strict=False,
                               embed_dim=32, depth=2,
                               num_heads=2, mlp_dim=64, img_size=32, patch_size=8, num_classes=5)
    assert "head.fc.weight" in caplog.text
    assert not torch.equal(loaded.head.fc.weight, state["head.fc.weight"].float())
    assert torch.equal(loaded.head.fc.bias, model.head.fc.bias)


@pytest.mark.parametrize("bad", [torch.full((1000,), 0.123456), {"w": torch.full((50,), 0.123456)},
                                 {"w": "text"}, {}])
def test_no_error_prints_a_tensor(bad):
    with pytest.raises((vitzoo.ConfigError, CheckpointError)) as refused:
        vitzoo.from_pretrained(bad)
    with pytest.raises((vitzoo.ConfigError, CheckpointError)) as refused_too:
        vitzoo.create("vit_ti16", pretrained=bad)
    for message in (str(refused.value), str(refused_too.value)):
        assert "0.1235" not in message and "tensor(" not in message and len(message) < 2000, message
