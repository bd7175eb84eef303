"""Weights that do not load as they are, refused naming the file, the tensor and the cause: a
mis-shaped tensor, integers where floats belong, pickled code, damaged bytes, a timm ViT of
another form than the paper's. No error prints a tensor."""

from __future__ import annotations

import os

import pytest
import timm
import torch
from hub_testing import tiny  # tests/hub_testing.py
from safetensors.torch import save_file

import vitzoo
from vitzoo.errors import CheckpointError


def test_the_one_mis_shaped_tensor_is_named(tmp_path):
    state = dict(tiny().state_dict(), **{"encoder.blocks.1.mlp.fc1.bias": torch.zeros(80)})
    save_file(state, str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match=r"w\.safetensors do not fit the model.*\n.*size "
                                              r"mismatch for encoder\.blocks\.1\.mlp\.fc1\.bias"):
        vitzoo.from_pretrained(tmp_path / "w.safetensors", num_heads=2)


def test_pickled_code_never_runs_and_garbage_is_no_checkpoint(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"state_dict": tiny().state_dict(), "payload": Payload()}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match="holds Python objects besides tensors"):
        vitzoo.from_pretrained(tmp_path / "evil.pth")
    assert not marker.exists()
    torch.save(tiny().state_dict(), tmp_path / "torch.safetensors")  # a misnamed torch file
    (tmp_path / "cut.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"")
    for name, content in (("empty.pth", b""), ("random.pth", os.urandom(1000)),
                          ("text.pth", b"hello, not weights"), ("torch.safetensors", None),
                          ("cut.safetensors", None)):
        if content is not None:
            (tmp_path / name).write_bytes(content)
        with pytest.raises(CheckpointError, match="is damaged, truncated or not a file of its "
                                                  "type") as err:
            vitzoo.from_pretrained(tmp_path / name)
        assert "weights_only" not in str(err.value)  # torch's advice: run the pickles


@pytest.mark.parametrize("model, options, fragment", [
    ("vit_tiny_patch16_224", dict(reg_tokens=4), "not a ViT of the paper's form"),
    ("vit_tiny_patch16_224", dict(no_embed_class=True), "not a ViT of the paper's form"),
    ("deit_tiny_distilled_patch16_224", {}, "not a ViT of the paper's form"),
    ("vit_tiny_patch16_224", dict(global_pool="avg"), "average the patches beside a class token"),
])
def test_timm_weights_of_another_form_than_the_papers_are_said_to_be_so(
        tmp_path, model, options, fragment):
    reference = timm.create_model(model, img_size=32, patch_size=8, depth=1, **options)
    save_file(reference.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match=fragment):
        vitzoo.from_pretrained(tmp_path / "w.safetensors")


def test_integer_weights_are_refused_naming_each(tmp_path):
    state = {k: v.clone() for k, v in tiny().state_dict().items()}
    state.update({"head.fc.bias": state["head.fc.bias"].to(torch.int8),
                  "encoder.norm.weight": state["encoder.norm.weight"].bool()})
    torch.save(state, tmp_path / "w.pth")
    tiny().save_pretrained(tmp_path / "saved")
    save_file(state, str(tmp_path / "saved" / "model.safetensors"))
    for path in ("w.pth", "saved"):
        with pytest.raises(CheckpointError, match=r"hold integers where the model has floats: "
                                                  r"encoder\.norm\.weight: bool, head\.fc\.bias: "
                                                  r"int8"):
            vitzoo.from_pretrained(tmp_path / path, num_heads=2)


@pytest.mark.parametrize("bad", [torch.full((1000,), 0.123456),
                                 {"w": torch.full((50,), 0.123456)}, {"w": "text"}, {}])
def test_no_error_prints_a_tensor(bad):
    for call in (lambda: vitzoo.from_pretrained(bad),
                 lambda: vitzoo.create("vit_ti16", pretrained=bad)):
        with pytest.raises((TypeError, CheckpointError)) as refused:
            call()
        message = str(refused.value)
        assert "0.1235" not in message and "tensor(" not in message and len(message) < 2000
