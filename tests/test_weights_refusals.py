"""Weights that do not load as they are, refused naming the file, the tensor and the cause: a
mis-shaped tensor, integers where floats belong, pickled code, bytes of another format than the
name says, a timm ViT of another form than the paper's. No error prints a tensor."""

from __future__ import annotations

import logging
import os

import pytest
import timm
import torch
from hub_testing import tiny  # tests/hub_testing.py
from safetensors.torch import save_file

import vitzoo
from vitzoo.errors import CheckpointError

TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=8,
            num_classes=5)


@pytest.mark.parametrize("name, shape", [("encoder.blocks.0.mlp.fc1.weight", (96, 32)),
                                         ("encoder.blocks.1.mlp.fc1.bias", (80,))])
def test_the_one_mis_shaped_tensor_is_named(tmp_path, name, shape):
    state = dict(tiny().state_dict(), **{name: torch.zeros(shape)})
    save_file(state, str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match=r"mis-shaped \(1\): " + name.replace(".", r"\.")):
        vitzoo.from_pretrained(tmp_path / "w.safetensors", num_heads=2)


def test_pickled_code_never_runs_and_garbage_is_no_checkpoint(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"state_dict": tiny().state_dict(), "payload": Payload()}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match="holds Python objects besides tensors.*"
                                              "weights_only"):
        vitzoo.from_pretrained(tmp_path / "evil.pth")
    assert not marker.exists()
    for content in (b"", os.urandom(1000), b"hello, not weights"):
        (tmp_path / "w.pth").write_bytes(content)
        with pytest.raises(CheckpointError, match="is not a checkpoint|damaged") as err:
            vitzoo.from_pretrained(tmp_path / "w.pth")
        assert "Python objects" not in str(err.value)


def test_a_torch_file_named_safetensors_is_said_to_be_one(tmp_path):
    for zipped in (True, False):
        path = tmp_path / f"weights{zipped}.safetensors"
        torch.save(tiny().state_dict(), path, _use_new_zipfile_serialization=zipped)
        with pytest.raises(CheckpointError, match="not a safetensors file: its bytes are a "
                                                  "(zip archive of pickles|pickle)"):
            vitzoo.from_pretrained(path)
        path.rename(path.with_suffix(".pth"))  # as the error says: then it reads
        assert vitzoo.from_pretrained(path.with_suffix(".pth"), num_heads=2).config.depth == 2
    (tmp_path / "cut.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"")
    with pytest.raises(CheckpointError, match="damaged or truncated"):
        vitzoo.from_pretrained(tmp_path / "cut.safetensors")


def test_an_unreadable_weights_file_is_not_called_damaged(tmp_path):
    tiny().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "model.safetensors").mkdir()  # a directory where the file belongs
    with pytest.raises(CheckpointError, match="cannot read .*model.safetensors") as err:
        vitzoo.from_pretrained(tmp_path)
    assert "damaged" not in str(err.value)


@pytest.mark.parametrize("model, options, fragment", [
    ("vit_tiny_patch16_224", dict(reg_tokens=4), "register tokens"),
    ("vit_tiny_patch16_224", dict(no_embed_class=True), "no_embed_class"),
    ("deit_tiny_distilled_patch16_224", {}, "distillation token"),
    ("vit_tiny_patch16_224", dict(global_pool="avg"), "class token and fc_norm"),
])
def test_timm_weights_of_another_form_than_the_papers_are_said_to_be_so(
        tmp_path, model, options, fragment):
    reference = timm.create_model(model, img_size=32, patch_size=8, depth=1, **options)
    save_file(reference.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match=fragment) as err:
        vitzoo.from_pretrained(tmp_path / "w.safetensors")
    assert "square grid" not in str(err.value)


def retyped(changes: dict) -> dict:
    state = {k: v.clone() for k, v in tiny().state_dict().items()}
    return {**state, **{name: (state[name] * 100).to(dtype) for name, dtype in changes.items()}}


@pytest.mark.parametrize("changes", [{"encoder.blocks.1.attn.qkv.weight": torch.int64},
                                     {"head.fc.bias": torch.int8, "stem.proj.weight": torch.int32},
                                     {"encoder.norm.weight": torch.bool}])
def test_integer_or_boolean_weights_are_refused_naming_each(tmp_path, changes):
    state = retyped(changes)
    save_file(state, str(tmp_path / "w.safetensors"))
    torch.save(state, tmp_path / "w.pth")
    tiny().save_pretrained(tmp_path / "saved")
    save_file(state, str(tmp_path / "saved" / "model.safetensors"))
    for path in ("w.safetensors", "w.pth", "saved"):
        with pytest.raises(CheckpointError, match="not floating-point") as err:
            vitzoo.from_pretrained(tmp_path / path, num_heads=2)
        for name, dtype in changes.items():
            assert f"{name}: {str(dtype).removeprefix('torch.')}" in str(err.value)


def test_integer_weights_are_left_out_by_strict_false(tmp_path, caplog):
    state = retyped({"head.fc.weight": torch.int64})
    save_file(state, str(tmp_path / "w.safetensors"))
    with caplog.at_level(logging.WARNING, logger="vitzoo"):
        loaded = vitzoo.create("vit_b16", pretrained=tmp_path / "w.safetensors", strict=False,
                               **TINY)
    assert "head.fc.weight" in caplog.text  # left at its init, never cast in
    assert not torch.equal(loaded.head.fc.weight, state["head.fc.weight"].float())
    assert torch.equal(loaded.head.fc.bias, state["head.fc.bias"])


@pytest.mark.parametrize("bad", [torch.full((1000,), 0.123456),
                                 {"w": torch.full((50,), 0.123456)}, {"w": "text"}, {}])
def test_no_error_prints_a_tensor(bad):
    for call in (lambda: vitzoo.from_pretrained(bad),
                 lambda: vitzoo.create("vit_ti16", pretrained=bad)):
        with pytest.raises((vitzoo.ConfigError, CheckpointError)) as refused:
            call()
        message = str(refused.value)
        assert "0.1235" not in message and "tensor(" not in message and len(message) < 2000
