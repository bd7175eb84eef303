"""What comes from the Hub, and what goes to it, is what it says it is: a cached file that no longer
matches its hash is never loaded, a folder that does not load as a model is never pushed, and a repo
asked to be private is private."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
import torch
from hub_testing import TOKEN, tiny  # tests/hub_testing.py

import vitzoo
from vitzoo.errors import HubError
from vitzoo.weights.hub import download


pytestmark = pytest.mark.usefixtures("hermetic_hub")  # tests/conftest.py


def same_model(a, b) -> bool:
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        return a.config == b.config and torch.equal(a.eval()(x), b.eval()(x))


def cached_blob(repo_id: str, name: str) -> Path:
    """The blob a cached snapshot file points to (the file's bytes; the cache names it by its hash)."""
    return (download(f"hf-hub:{repo_id}", local_files_only=True) / name).resolve()


def flip_a_byte(path: Path, offset_from_end: int = 13) -> None:
    """Change one byte of `path` in place (as a failing disk would); the file's size stays the same. The
    default: an exponent bit of the last float of a safetensors file (the one weight changes a lot)."""
    time.sleep(0.02)  # past the file system's timestamp tick: the file's state changes with its bytes
    with open(path, "r+b") as f:
        f.seek(-offset_from_end, 2)
        byte = f.read(1)
        f.seek(-offset_from_end, 2)
        f.write(bytes([byte[0] ^ 0x40]))


def edit_config(path: Path, **changes) -> None:
    time.sleep(0.02)
    document = json.loads(path.read_text())
    document["model"].update(changes)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")


def go_offline(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# ------------------------------------------------------------------ 1. a damaged file in the Hub cache
def test_a_bit_flipped_cached_weights_blob_is_downloaded_again_online(hub_server, caplog):
    """One byte changed inside the tensor data of a cached model.safetensors blob: the next load online
    notices that the blob no longer matches its sha256, removes it, downloads it again and loads the
    model that was pushed, saying so."""
    model = tiny()
    model.push_to_hub("alice/flip", token=TOKEN)
    vitzoo.from_pretrained("hf-hub:alice/flip")
    blob = cached_blob("alice/flip", "model.safetensors")
    flip_a_byte(blob)
    with caplog.at_level(logging.WARNING, logger="vitzoo"):
        again = vitzoo.from_pretrained("hf-hub:alice/flip")
    assert same_model(again, model)
    assert "model.safetensors" in caplog.text and "sha256" in caplog.text and "downloaded again" in caplog.text


def test_a_bit_flipped_cached_weights_blob_is_refused_offline_and_pull_repairs_it(hub_server, monkeypatch, capsys, caplog):
    """Offline, the damaged blob is not loaded: a HubError names the file, says its bytes no longer match
    the sha256 the cache names it by, and that `vitzoo pull REPO` repairs it; online, `vitzoo pull`
    does, and the model then loads offline."""
    from vitzoo.cli import main

    model = tiny()
    model.push_to_hub("alice/flip", token=TOKEN)
    assert main(["pull", "alice/flip"]) == 0
    flip_a_byte(cached_blob("alice/flip", "model.safetensors"))
    go_offline(monkeypatch)
    with pytest.raises(HubError, match=r"(?s)cached model.safetensors of alice/flip is damaged: .*sha256.*`vitzoo pull alice/flip`"):
        vitzoo.from_pretrained("hf-hub:alice/flip")
    assert main(["pull", "alice/flip"]) == 2  # offline: the same message, in one line
    assert "vitzoo pull alice/flip" in capsys.readouterr().err
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with caplog.at_level(logging.WARNING, logger="vitzoo"):
        assert main(["pull", "alice/flip"]) == 0
    assert "downloaded again" in caplog.text
    go_offline(monkeypatch)
    assert same_model(vitzoo.from_pretrained("hf-hub:alice/flip"), model)


def test_a_hand_edited_cached_config_is_not_used(hub_server, monkeypatch):
    """A cached config.json edited by hand (it still reads as a valid config) no longer matches the
    git hash the cache names its blob by: offline it is refused, online it is downloaded again."""
    model = tiny()
    model.push_to_hub("alice/edited", token=TOKEN)
    vitzoo.from_pretrained("hf-hub:alice/edited")
    edit_config(cached_blob("alice/edited", "config.json"), act="gelu_tanh")
    go_offline(monkeypatch)
    with pytest.raises(HubError, match=r"(?s)cached config.json of alice/edited is damaged: .*git blob sha1.*`vitzoo pull alice/edited`"):
        vitzoo.from_pretrained("hf-hub:alice/edited")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    again = vitzoo.from_pretrained("hf-hub:alice/edited")
    assert again.config.act == "gelu" and same_model(again, model)


def test_a_cached_file_is_hashed_once_per_file_state(hub_server, monkeypatch):
    """A blob whose hash matched is not hashed again while its size, times and inode stay the same;
    touched, it is hashed again."""
    from huggingface_hub.utils import sha

    tiny().push_to_hub("alice/once", token=TOKEN)
    vitzoo.from_pretrained("hf-hub:alice/once")
    hashed = []
    real = sha.sha_fileobj
    monkeypatch.setattr(sha, "sha_fileobj", lambda f: hashed.append(f.name) or real(f))
    vitzoo.from_pretrained("hf-hub:alice/once")
    vitzoo.from_pretrained("hf-hub:alice/once")
    assert hashed == []
    time.sleep(0.02)
    cached_blob("alice/once", "model.safetensors").touch()
    vitzoo.from_pretrained("hf-hub:alice/once")
    assert len(hashed) == 1


# ------------------------------------------------------------------ 2. a folder that does not load is never pushed
def nothing_on_the_hub(hub, repo_id: str) -> bool:
    from huggingface_hub import HfApi

    return not HfApi(endpoint=hub.url, token=TOKEN).repo_exists(repo_id)


def break_weights(saved: Path, how: str) -> None:
    weights = saved / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes({"truncated": data[: len(data) // 2], "100 bytes": data[:100], "empty": b""}[how])


@pytest.mark.parametrize("how", ["truncated", "100 bytes", "empty"])
def test_a_folder_with_broken_weights_is_not_pushed(hub_server, tmp_path, capsys, how):
    """`vitzoo push` of a folder whose model.safetensors is truncated, 100 bytes or empty fails in one
    line naming the file, before anything is uploaded: the repo is not even created."""
    from vitzoo.cli import main

    tiny().save_pretrained(tmp_path / "saved")
    break_weights(tmp_path / "saved", how)
    assert main(["push", str(tmp_path / "saved"), "alice/broken", "--token", TOKEN]) == 2
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "nothing was pushed to alice/broken" in err and "Traceback" not in err
    assert nothing_on_the_hub(hub_server, "alice/broken")


@pytest.mark.parametrize("change", [{"mlp_dim": 96}, {"depth": 3}, {"num_classes": 7}, {"pos_embed": "none"}])
def test_a_folder_whose_config_does_not_fit_its_weights_is_not_pushed(hub_server, tmp_path, capsys, change):
    """A config.json that describes another model than the weights beside it is refused before any
    upload, listing what does not fit."""
    from vitzoo.cli import main

    tiny().save_pretrained(tmp_path / "saved")
    config = tmp_path / "saved" / "config.json"
    edit_config(config, **change)
    assert main(["push", str(tmp_path / "saved"), "alice/misfit", "--token", TOKEN]) == 2
    err = capsys.readouterr().err
    # what does not fit is listed: by the weights' check, or, for the shape options, by config.json's
    # comparison with the tensors before anything is built
    assert ("do not fit the model" in err or "fix config.json" in err) and "nothing was pushed to alice/misfit" in err
    assert nothing_on_the_hub(hub_server, "alice/misfit")


def test_a_model_changed_after_it_was_built_is_not_pushed(hub_server):
    """push_to_hub of a model whose head was replaced by hand (its config still says 5 classes) is
    refused before any upload: what would be pushed does not load."""
    from vitzoo.errors import CheckpointError

    model = tiny()
    model.head.fc = torch.nn.Linear(32, 9)
    with pytest.raises(CheckpointError, match=r"(?s)nothing was pushed to alice/changed.*head.fc.weight"):
        model.push_to_hub("alice/changed", token=TOKEN)
    assert nothing_on_the_hub(hub_server, "alice/changed")


# ------------------------------------------------------------------ 3. --private makes the repo private
def anonymous_read_works(hub, repo_id: str) -> bool:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        HfApi(endpoint=hub.url, token=False).model_info(repo_id)
    except RepositoryNotFoundError:
        return False
    return True


def test_push_private_to_an_existing_public_repo_makes_it_private(hub_server, tmp_path, capsys, caplog):
    """`vitzoo push --private` to a repo that exists and is public makes it private before the upload,
    says so, and anonymous reads stop working; a push without --private leaves a private repo private."""
    from vitzoo.cli import main

    tiny().push_to_hub("alice/public", token=TOKEN)
    assert anonymous_read_works(hub_server, "alice/public")
    tiny(1).save_pretrained(tmp_path / "saved")
    with caplog.at_level(logging.WARNING, logger="vitzoo"):
        assert main(["push", str(tmp_path / "saved"), "alice/public", "--private", "--token", TOKEN]) == 0
    assert "alice/public was public: made it private" in caplog.text
    assert not anonymous_read_works(hub_server, "alice/public")
    assert main(["push", str(tmp_path / "saved"), "alice/public", "--token", TOKEN]) == 0
    assert not anonymous_read_works(hub_server, "alice/public")


def test_push_private_fails_when_the_server_cannot_make_the_repo_private(hub_server, monkeypatch):
    """A server that does not change the visibility (it refuses, or answers yes and leaves it public) is
    a HubError saying the repo is still public; nothing is uploaded."""
    from huggingface_hub import HfApi

    tiny().push_to_hub("alice/stays", token=TOKEN)
    before = HfApi(endpoint=hub_server.url, token=TOKEN).model_info("alice/stays").sha
    monkeypatch.setattr(HfApi, "update_repo_settings", lambda self, *a, **k: None)  # says nothing, does nothing
    with pytest.raises(HubError, match=r"alice/stays on \S+ is still public.*nothing was uploaded"):
        tiny(1).push_to_hub("alice/stays", token=TOKEN, private=True)
    assert HfApi(endpoint=hub_server.url, token=TOKEN).model_info("alice/stays").sha == before
