"""Errors name the real cause (issue 23): the one mis-shaped tensor, not the five that fit; a garbage
torch file is not said to hold Python objects; timm weights of another form than the paper's are
said to be so; a full disk during a checkpoint is said to be one; a NaN's step is the step the metrics
give it; offline advice keeps the @REVISION."""

from __future__ import annotations

import json
import os

import pytest
import torch
from hub_testing import TOKEN, tiny  # tests/hub_testing.py
from safetensors.torch import save_file

import vitzoo
from vitzoo.errors import CheckpointError, HubError, TrainingDiverged


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
    torch.save({"model": tiny().state_dict(), "optimizer_class": torch.optim.SGD}, tmp_path / "w.pth")
    with pytest.raises(CheckpointError, match="holds Python objects besides tensors"):
        vitzoo.from_pretrained(tmp_path / "w.pth")


@pytest.mark.parametrize("model, options, fragment", [
    ("vit_tiny_patch16_224", dict(reg_tokens=4), "register tokens"),
    ("vit_tiny_patch16_224", dict(no_embed_class=True), "no_embed_class"),
    ("deit_tiny_distilled_patch16_224", {}, "distillation token"),
])
def test_timm_weights_of_another_form_than_the_papers_are_said_to_be_so(tmp_path, model, options, fragment):
    """Register tokens, DeiT's distillation token and no_embed_class are named, not taken for a
    damaged (not square) position-embedding grid."""
    timm = pytest.importorskip("timm")
    reference = timm.create_model(model, pretrained=False, img_size=32, patch_size=8, **options)
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match="not a ViT of the paper's form") as err:
        vitzoo.from_pretrained(tmp_path / "w.safetensors")
    assert fragment in str(err.value) and "square grid" not in str(err.value)


def test_a_full_disk_during_a_checkpoint_is_said_to_be_one(tmp_path, monkeypatch):
    """torch.save's C++ writer failing for a full disk ("[enforce fail at inline_container.cc:672]")
    is an OSError naming the checkpoint file and the space left; the previous checkpoint stays."""
    import shutil
    from collections import namedtuple

    from vitzoo.train import checkpoint

    model = tiny()
    checkpoint.save(tmp_path / "checkpoints", 1, model, {"step": 1})

    def full(obj, f):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: namedtuple("usage", "total used free")(10**9, 10**9, 4096))
    with pytest.raises(OSError, match=r"the disk is full: checkpoint step_00000002 \(model.safetensors and state.pt\).*"
                                      r"0.0 MB are free there.*the last good checkpoint, step_00000001, is kept"):
        checkpoint.save(tmp_path / "checkpoints", 2, model, {"step": 2})
    assert checkpoint.latest(tmp_path / "checkpoints").name == "step_00000001"


@pytest.mark.parametrize("log_every", [1, 3])
def test_a_nan_is_reported_at_the_step_the_metrics_give_it(tmp_path, log_every):
    """The step a NaN loss is reported at is numbered as the metrics number steps (1 for the first): the
    metrics' last line is the step before it, and summary.json gives the same step."""
    from vitzoo.train import TrainConfig, fit

    config = TrainConfig(model="vit_ti16", model_options=dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64,
                                                               img_size=28, patch_size=7),
                         data="synthetic", train_limit=32, test_limit=16, batch_size=16, steps=3, lr=1e30, warmup=0,
                         log_every=log_every, checkpoint_every=0, quiet=True, tensorboard=False, out=str(tmp_path / "run"),
                         device="cpu")
    with pytest.raises(TrainingDiverged) as err:
        fit(config)
    step = int(str(err.value).split(" at step ")[1].split()[0].rstrip(";,"))
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = {line["step"]: line.get("loss") for line in lines if "loss" in line}
    # the steps before it logged finite losses, the last of them numbered step - 1; summary.json agrees
    assert step >= 1 and (max(losses, default=0) == step - 1 or log_every > 1)
    assert all(loss is not None and loss == loss for loss in losses.values())
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["step"] == step


def test_offline_advice_for_an_uncached_revision_keeps_the_revision(hermetic_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match=r"`vitzoo pull alice/model@v2`"):
        vitzoo.from_pretrained("hf-hub:alice/model@v2")


def test_a_broken_repo_is_not_said_to_be_fixed_by_downloading_again(hub_server, tmp_path):
    """Weights that do not load from a Hub repo whose files match their hashes: the error says the repo
    holds them so (a revision that works, or its owner), not only to download them again."""
    from huggingface_hub import HfApi

    tiny().save_pretrained(tmp_path / "saved")
    weights = tmp_path / "saved" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    api = HfApi(endpoint=hub_server.url, token=TOKEN)  # past vitzoo's push check, as another tool would
    api.create_repo("alice/broken")
    api.upload_folder(repo_id="alice/broken", folder_path=tmp_path / "saved")
    with pytest.raises(CheckpointError, match="the repo itself holds them so"):
        vitzoo.from_pretrained("hf-hub:alice/broken")
