"""What comes from the Hub and what goes to it is what it says it is: a cached file that no longer
matches its hash is never loaded (online it is downloaded again, offline refused), and a folder
that does not load as the model its config describes is never pushed."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, constants
from huggingface_hub.utils import sha
from hub_testing import TOKEN, assert_same_model, tiny  # tests/hub_testing.py

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import CheckpointError, HubError


def cached(repo_id: str, name: str) -> Path:
    """The blob of a cached file (the cache names it by the file's hash)."""
    folder = Path(constants.HF_HUB_CACHE) / f"models--{repo_id.replace('/', '--')}"
    return next(folder.glob(f"snapshots/*/{name}")).resolve()


def flip_a_byte(path: Path) -> None:
    """One byte of `path` changed in place, as by a failing disk; its size stays."""
    time.sleep(0.02)  # past the file system's timestamp tick: the file's state changes
    data = bytearray(path.read_bytes())
    data[-13] ^= 0x40  # in a safetensors file: an exponent bit of the last weight
    path.write_bytes(bytes(data))


def pushed_and_pulled(repo_id: str):
    model = tiny()
    model.push_to_hub(repo_id, token=TOKEN)
    vitzoo.from_pretrained(f"hf-hub:{repo_id}")
    return model


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])  # sha256, git blob sha1
def test_a_damaged_cached_file_is_downloaded_again_online(hub_server, caplog, name):
    model = pushed_and_pulled("alice/flip")
    flip_a_byte(cached("alice/flip", name))
    with caplog.at_level(logging.WARNING, logger="vitzoo"):
        assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/flip"))
    assert f"cached {name} of alice/flip no longer matches its hash" in caplog.text


def test_offline_a_damaged_cached_file_is_refused_and_pull_repairs_it(hub_server, monkeypatch,
                                                                      capsys):
    model = pushed_and_pulled("alice/flip")
    flip_a_byte(cached("alice/flip", "model.safetensors"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    said = "no longer matches its hash: not loaded; run `vitzoo pull alice/flip` online"
    with pytest.raises(HubError, match=said):
        vitzoo.from_pretrained("hf-hub:alice/flip")
    assert main(["pull", "alice/flip"]) == 2
    assert "no longer matches its hash" in capsys.readouterr().err
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert main(["pull", "alice/flip"]) == 0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/flip"))


def test_a_cached_file_is_hashed_once_per_file_state(hub_server, monkeypatch):
    pushed_and_pulled("alice/once")
    hashed, real = [], sha.sha_fileobj
    monkeypatch.setattr(sha, "sha_fileobj", lambda f: hashed.append(f.name) or real(f))
    vitzoo.from_pretrained("hf-hub:alice/once")
    assert hashed == []
    time.sleep(0.02)
    cached("alice/once", "model.safetensors").touch()
    vitzoo.from_pretrained("hf-hub:alice/once")
    assert len(hashed) == 1


def test_a_file_the_hub_sends_with_other_bytes_than_its_hash_is_not_loaded(hub_server):
    tiny().push_to_hub("alice/liar", token=TOKEN)
    info = HfApi(endpoint=hub_server.url).list_repo_tree("alice/liar")
    weights = next(f for f in info if f.path == "model.safetensors").lfs.sha256
    flip_a_byte(hub_server.root / "blobs" / weights)
    with pytest.raises(HubError, match="model.safetensors of alice/liar no longer matches"):
        vitzoo.from_pretrained("hf-hub:alice/liar")


def test_weights_the_repo_itself_holds_broken_are_said_to_be_so(hub_server, tmp_path):
    tiny().save_pretrained(tmp_path / "saved")
    weights = tmp_path / "saved" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    api = HfApi(endpoint=hub_server.url, token=TOKEN)  # not vitzoo's push, which checks first
    api.create_repo("alice/broken")
    api.upload_folder(repo_id="alice/broken", folder_path=tmp_path / "saved")
    with pytest.raises(CheckpointError, match="the repo itself holds them so"):
        vitzoo.from_pretrained("hf-hub:alice/broken")


def config_with(**changes):
    def edit(data: bytes) -> bytes:
        document = json.loads(data)
        return json.dumps({**document, "model": {**document["model"], **changes}}).encode()
    return "config.json", edit


@pytest.mark.parametrize("name, change", [
    ("model.safetensors", lambda data: data[:len(data) // 2]),
    ("model.safetensors", lambda data: data[:100]), ("model.safetensors", lambda data: b""),
    config_with(mlp_dim=96), config_with(depth=3), config_with(num_classes=7),
    config_with(pos_embed="none")], ids=["half", "100 bytes", "empty", "mlp_dim", "depth",
                                         "num_classes", "pos_embed"])
def test_a_folder_that_does_not_load_is_never_pushed(hub_server, tmp_path, capsys, name, change):
    tiny().save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / name).write_bytes(change((tmp_path / "saved" / name).read_bytes()))
    assert main(["push", str(tmp_path / "saved"), "alice/misfit", "--token", TOKEN]) == 2
    assert "nothing was pushed to alice/misfit" in capsys.readouterr().err
    assert not HfApi(endpoint=hub_server.url, token=TOKEN).repo_exists("alice/misfit")


def test_a_model_changed_after_it_was_built_is_never_pushed(hub_server):
    model = tiny()
    model.head.fc = torch.nn.Linear(32, 9)  # its config still says 5 classes
    with pytest.raises(CheckpointError, match="(?s)nothing was pushed to alice/x.*head.fc.weight"):
        model.push_to_hub("alice/x", token=TOKEN)
    assert not HfApi(endpoint=hub_server.url, token=TOKEN).repo_exists("alice/x")
