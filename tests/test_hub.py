"""Push to and pull from a Hugging Face Hub, end to end: the real huggingface_hub client over HTTP
against the test Hub (tests/hubserver) on 127.0.0.1, with the cache in tmp_path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from huggingface_hub import HfApi
from hub_testing import TOKEN, assert_same_model, tiny  # tests/hub_testing.py
from safetensors.torch import load_file

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import HubError


def test_a_push_is_one_commit_and_a_pull_fills_the_cache(hub_server, hermetic_hub):
    model = tiny()
    url = model.push_to_hub("alice/vit", token=TOKEN)
    sha = re.fullmatch(rf"{hub_server.url}/alice/vit/commit/([0-9a-f]{{40}})", url)[1]
    assert HfApi(endpoint=hub_server.url).model_info("alice/vit").sha == sha
    assert len(hub_server.repos["alice/vit"]["commits"]) == 2  # the repo's creation, the push
    assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/vit"))
    snapshot = hermetic_hub / "hf_home/hub/models--alice--vit/snapshots" / sha
    assert sorted(p.name for p in snapshot.iterdir()) == [
        "README.md", "config.json", "model.safetensors"]


def test_a_revision_is_a_commit_or_a_branch_pushed_to(hub_server):
    first, second = tiny(0), tiny(1)
    sha = first.push_to_hub("alice/rev", token=TOKEN).rsplit("/", 1)[1]
    second.push_to_hub("alice/rev", token=TOKEN)
    first.push_to_hub("alice/rev", token=TOKEN, revision="stable")  # a new branch
    for revision, model in (("", second), ("@main", second), (f"@{sha}", first),
                            ("@stable", first)):
        assert_same_model(model, vitzoo.from_pretrained(f"hf-hub:alice/rev{revision}"))


def test_offline_a_pulled_model_loads_and_the_rest_is_refused(hub_server, monkeypatch):
    model = tiny()
    model.push_to_hub("alice/off", token=TOKEN)
    vitzoo.from_pretrained("hf-hub:alice/off")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/off"))
    for missing in ("alice/off@other", "alice/never"):
        said = f"{missing} is not in the Hugging Face cache .*`vitzoo pull {missing}` online"
        with pytest.raises(HubError, match=said) as error:
            vitzoo.from_pretrained(f"hf-hub:{missing}")
        assert error.value.not_cached
    with pytest.raises(HubError, match="HF_HUB_OFFLINE=1 forbids pushing alice/off: unset it"):
        model.push_to_hub("alice/off", token=TOKEN)


def test_private_hides_a_new_repo_and_one_pushed_before(hub_server, tmp_path):
    anonymous = HfApi(endpoint=hub_server.url, token=False)
    tiny().push_to_hub("alice/new", token=TOKEN, private=True)
    tiny().push_to_hub("alice/old", token=TOKEN)
    assert anonymous.repo_exists("alice/old")
    tiny(1).save_pretrained(tmp_path / "saved")
    assert main(["push", str(tmp_path / "saved"), "alice/old", "--private", "--token", TOKEN]) == 0
    assert not anonymous.repo_exists("alice/new") and not anonymous.repo_exists("alice/old")


def test_a_repo_with_only_pytorch_model_bin_loads(hub_server, tmp_path):
    """Without model.safetensors, the same commit's pytorch_model.bin is fetched (timm's files)."""
    model = tiny()
    model.save_pretrained(tmp_path / "repo", format="timm")
    weights, config = tmp_path / "repo" / "model.safetensors", tmp_path / "repo" / "config.json"
    torch.save(load_file(weights), tmp_path / "repo" / "pytorch_model.bin")
    weights.unlink()
    timm_keys = ("architecture", "model_args", "num_classes", "num_features", "pretrained_cfg")
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items()
                                  if k in timm_keys}))
    api = HfApi(endpoint=hub_server.url, token=TOKEN)
    api.create_repo("alice/bin")
    api.upload_folder(repo_id="alice/bin", folder_path=tmp_path / "repo")
    assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/bin"))


@pytest.mark.slow  # a fresh process imports vitzoo
def test_the_cli_pushes_and_pulls_with_hf_settings_only(hub_server, tmp_path, monkeypatch, capsys):
    model = tiny()
    model.save_pretrained(tmp_path / "saved", card={"dataset": "cifar10"})
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert main(["push", str(tmp_path / "saved"), "alice/cli"]) == 0
    assert "alice/cli/commit/" in capsys.readouterr().out
    assert main(["pull", "alice/cli", str(tmp_path / "pulled")]) == 0
    assert_same_model(model, vitzoo.from_pretrained(tmp_path / "pulled"))
    assert "cifar10" in (tmp_path / "pulled" / "README.md").read_text()
    # huggingface_hub reads HF_HOME and HF_HUB_OFFLINE once, at import: a fresh process
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    offline = subprocess.run([sys.executable, "-m", "vitzoo", "pull", "alice/cli",
                              str(tmp_path / "offline")], env=env, capture_output=True, text=True)
    assert offline.returncode == 0, offline.stderr
    assert_same_model(model, vitzoo.from_pretrained(tmp_path / "offline"))
