"""Push to and pull from a Hugging Face Hub, end to end: the real huggingface_hub client over real
HTTP against the test Hub (tests/hubserver) on 127.0.0.1, with the cache in tmp_path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hub_testing import TOKEN, assert_cache_clean, assert_same_model, cache_dir, tiny

import vitzoo
from vitzoo.weights.hub import download, parse
from vitzoo.errors import CheckpointError, HubError


pytestmark = pytest.mark.usefixtures("hermetic_hub")  # tests/conftest.py


def test_parse_references():
    assert parse("hf-hub:org/name") == ("org/name", None)
    assert parse("hf-hub:org/na.me-1@v1.0") == ("org/na.me-1", "v1.0")
    for bad in ("hf-hub:noslash", "hf-hub:org/name@", "hf-hub:a/b/c"):
        with pytest.raises(HubError, match="not a Hub model reference"):
            parse(bad)


def test_push_then_pull_into_an_empty_cache(hub_server):
    model = tiny()
    url = model.push_to_hub("alice/tiny-vit", token=TOKEN)
    assert url.startswith(hub_server.url) and "alice/tiny-vit" in url
    assert not cache_dir().exists() or not any(cache_dir().iterdir())
    pulled = vitzoo.from_pretrained("hf-hub:alice/tiny-vit")
    assert_same_model(model, pulled)
    snapshot = download("hf-hub:alice/tiny-vit")
    assert snapshot.is_relative_to(cache_dir())
    card = (snapshot / "README.md").read_text()
    # timm's layout: the default where timm builds the model (tests/test_hub_both_ways.py loads it in timm)
    assert card.startswith("---\n") and "library_name: timm" in card and 'from_pretrained("hf-hub:alice/tiny-vit")' in card
    config = json.loads((snapshot / "config.json").read_text())
    assert config["format"] == "vitzoo" and config["model"]["embed_dim"] == 32 and "vitzoo_version" in config
    # and under the zoo's name, with a new head
    named = vitzoo.create("vit_b16", pretrained="hf-hub:alice/tiny-vit", num_classes=3)
    assert named.config.num_classes == 3 and named.config.embed_dim == 32
    assert_cache_clean()


def test_pull_an_older_revision_after_a_second_push(hub_server):
    first, second = tiny(0), tiny(1)
    url = first.push_to_hub("alice/rev", token=TOKEN, commit_message="first")
    sha = re.search(r"/commit/([0-9a-f]{40})", url).group(1)
    second.push_to_hub("alice/rev", token=TOKEN, commit_message="second")
    assert_same_model(second, vitzoo.from_pretrained("hf-hub:alice/rev"))
    assert_same_model(first, vitzoo.from_pretrained(f"hf-hub:alice/rev@{sha}"))
    # a branch as revision: created on push
    first.push_to_hub("alice/rev", token=TOKEN, revision="stable")
    assert_same_model(first, vitzoo.from_pretrained("hf-hub:alice/rev@stable"))
    assert_same_model(second, vitzoo.from_pretrained("hf-hub:alice/rev@main"))


def test_offline_after_a_first_pull(hub_server, monkeypatch):
    model = tiny()
    model.push_to_hub("alice/offline", token=TOKEN)
    vitzoo.from_pretrained("hf-hub:alice/offline")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/offline"))
    with pytest.raises(HubError, match=r"alice/offline@other is not in the Hugging Face cache .*HF_HUB_OFFLINE=1"):
        vitzoo.from_pretrained("hf-hub:alice/offline@other")
    with pytest.raises(HubError, match="not in the Hugging Face cache"):
        vitzoo.from_pretrained("hf-hub:alice/never-pulled")
    assert_cache_clean()


def start_server_process(root: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.hubserver", "--root", str(root), "--port", "0", "--token", TOKEN],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
    )
    url = process.stdout.readline().strip()
    assert url.startswith("http://127.0.0.1:"), url
    return process, url


@pytest.mark.slow
def test_the_server_stopped_mid_session(tmp_path, monkeypatch):
    process, url = start_server_process(tmp_path / "hub")
    try:
        monkeypatch.setenv("HF_ENDPOINT", url)
        model = tiny()
        model.push_to_hub("alice/gone", token=TOKEN, revision="old")
        tiny(1).push_to_hub("alice/gone", token=TOKEN)
        vitzoo.from_pretrained("hf-hub:alice/gone")
    finally:
        process.kill()
        process.wait()
    # what is cached still loads; what is not names the unreachable server. (A revision given as a
    # commit sha is tried 5 times with back-off by huggingface_hub, ~23 s: a branch here keeps it fast.)
    vitzoo.from_pretrained("hf-hub:alice/gone")
    with pytest.raises(HubError, match=f"cannot reach the Hub at {re.escape(url)}.*not in the Hugging Face cache"):
        vitzoo.from_pretrained("hf-hub:alice/gone@old")
    with pytest.raises(HubError, match="cannot reach the Hub"):
        model.push_to_hub("alice/gone", token=TOKEN)
    assert_cache_clean()


def test_a_truncated_model_safetensors(hub_server, tmp_path):
    model = tiny()
    model.save_pretrained(tmp_path / "saved")
    weights = tmp_path / "saved" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="damaged or truncated"):
        vitzoo.from_pretrained(tmp_path / "saved")
    # the same in the cache: noticed before loading (the blob no longer matches its sha256), removed and
    # downloaded again whole
    model.push_to_hub("alice/trunc", token=TOKEN)
    blob = (download("hf-hub:alice/trunc") / "model.safetensors").resolve()
    blob.write_bytes(blob.read_bytes()[:100])
    again = vitzoo.from_pretrained("hf-hub:alice/trunc")
    assert_cache_clean()
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))


@pytest.mark.slow
def test_cli_push_and_pull_with_the_usual_environment(hub_server, tmp_path, monkeypatch, capsys):
    """`vitzoo push` / `vitzoo pull` configured only by HF_* variables; then an offline pull in a fresh
    process, where huggingface_hub reads HF_HOME and HF_HUB_OFFLINE at import as it does for users."""
    from vitzoo.cli import main

    model = tiny()
    model.save_pretrained(tmp_path / "saved", card={"dataset": "cifar10", "metrics": {"accuracy": 0.5}})
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert main(["push", str(tmp_path / "saved"), "alice/cli"]) == 0
    assert "alice/cli/commit/" in capsys.readouterr().out
    assert main(["pull", "alice/cli", str(tmp_path / "pulled")]) == 0
    assert_same_model(model, vitzoo.from_pretrained(tmp_path / "pulled"))
    card = (tmp_path / "pulled" / "README.md").read_text()
    assert "cifar10" in card and "accuracy" in card and "model-index" in card
    assert any(cache_dir().glob("models--alice--cli/snapshots/*/model.safetensors"))
    # the fixture's HF_HOME is the cache used above; the server is out of the picture offline
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    offline = subprocess.run([sys.executable, "-m", "vitzoo", "pull", "alice/cli", str(tmp_path / "offline")],
                             env=env, capture_output=True, text=True)
    assert offline.returncode == 0, offline.stderr
    assert_same_model(model, vitzoo.from_pretrained(tmp_path / "offline"))
    assert_cache_clean()


class CuttingProxy:
    """A TCP proxy in front of the server that cuts every response to a request for `target` after
    `keep` bytes and closes the connection: a server that dies in the middle of a download."""

    def __init__(self, upstream: str, target: bytes, keep: int = 4096) -> None:
        import socket
        import threading
        from urllib.parse import urlsplit

        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.target, self.keep = target, keep
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.cuts = 0
        self._socket, self._threading = socket, threading
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self._threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client) -> None:
        server = self._socket.create_connection(self.upstream)
        state = {"cut": False}

        def upstream_to_client() -> None:
            sent = 0
            try:
                while data := server.recv(65536):
                    if state["cut"]:
                        keep = self.keep if self.cuts == 0 else 0  # later attempts (resumes) get nothing
                        data = data[: max(keep - sent, 0)]
                        sent += len(data)
                    client.sendall(data)
                    if state["cut"] and sent >= keep:
                        self.cuts += 1
                        break
            except OSError:
                pass
            for s in (client, server):
                try:
                    s.shutdown(self._socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

        self._threading.Thread(target=upstream_to_client, daemon=True).start()
        try:
            while data := client.recv(65536):
                if data.startswith(b"GET ") and self.target in data.split(b"\r\n", 1)[0]:
                    state["cut"] = True
                server.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()


def test_the_server_dies_in_the_middle_of_a_download(hub_server, monkeypatch):
    """The weights are cut off mid-transfer: a clear error, no partial file in the snapshot, and the
    next pull (server back) completes it."""
    model = tiny(embed_dim=64, mlp_dim=128)  # ~0.4 MB of weights: several TCP reads
    model.push_to_hub("alice/cut", token=TOKEN)
    proxy = CuttingProxy(hub_server.url, b"model.safetensors", keep=20_000)
    try:
        monkeypatch.setenv("HF_ENDPOINT", proxy.url)
        with pytest.raises(HubError, match="broke off while downloading alice/cut.*resumes"):
            vitzoo.from_pretrained("hf-hub:alice/cut")
        assert proxy.cuts >= 1
    finally:
        proxy.close()
    assert not list(cache_dir().glob("models--alice--cut/snapshots/*/model.safetensors"))
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/cut"))
    assert_cache_clean()


def test_a_transformers_repo_with_only_pytorch_model_bin(hub_server, tmp_path):
    """Foreign repos load too; without model.safetensors the same commit's pytorch_model.bin is fetched."""
    import transformers
    from huggingface_hub import HfApi
    from safetensors.torch import load_file

    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                    image_size=32, patch_size=8, num_labels=3)
    reference = transformers.ViTForImageClassification(config).eval()
    reference.save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    torch.save(load_file(str(weights)), tmp_path / "hf" / "pytorch_model.bin")
    weights.unlink()
    api = HfApi(endpoint=hub_server.url, token=TOKEN)
    api.create_repo("google-ish/vit-tiny")
    api.upload_folder(repo_id="google-ish/vit-tiny", folder_path=tmp_path / "hf")
    model = vitzoo.from_pretrained("hf-hub:google-ish/vit-tiny")
    assert model.config.norm_eps == 1e-12 and model.config.num_classes == 3
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x).logits, atol=1e-4, rtol=0)
    assert_cache_clean()
