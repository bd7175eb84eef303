"""What the Hub tests share: a hermetic Hugging Face environment, a tiny model with random weights,
a model pulled once into the cache, `within` for calls that must not wait forever, and checks of
the cache and of two models. The fixtures built on them (`hermetic_hub`, `hub_server`,
`one_second`) are in tests/conftest.py."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from huggingface_hub import constants

import vitzoo

TOKEN = "test-token"
TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=8, num_classes=5)


def hermetic_hub_environment(monkeypatch, tmp_path) -> None:
    """A cache of our own, no stray token, no Xet uploads (the test server has no Xet storage)."""
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def tiny(seed: int = 0, **changes):
    """A tiny ViT-B/16-shaped model whose weights are drawn from `seed` (not the init's zeros)."""
    torch.manual_seed(seed)
    model = vitzoo.create("vit_b16", **{**TINY, **changes})
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model.eval()


def pulled_once(model, repo_id: str, root, monkeypatch) -> None:
    """`model` pushed to a loopback Hub in `root` and pulled once, so that the cache holds it; the Hub is
    gone afterwards (HF_ENDPOINT still names it: the test points it elsewhere)."""
    from hubserver import HubServer

    with HubServer(root, token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        model.push_to_hub(repo_id, token=TOKEN)
        vitzoo.from_pretrained(f"hf-hub:{repo_id}")


# A call still waiting after this long hangs. The waits under test are of 1-3 s; the call's own work (a model
# built, torch's compiler imported on first use) took up to 15 s on 2 cores shared with other test workers.
HANGS_AFTER_S = 60


def within(seconds: float, call):
    """`call()`'s result, or its exception raised here; fails the test when it is still waiting after
    `seconds` (the thread is left to the server's teardown, which closes its connections)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def cache_dir() -> Path:
    return Path(constants.HF_HUB_CACHE)


def assert_cache_clean() -> None:
    """Nothing half-written: no partial blobs, every snapshot entry points to a complete file."""
    root = cache_dir()
    if not root.exists():
        return
    assert not list(root.rglob("*.incomplete"))
    for link in root.glob("models--*/snapshots/*/*"):
        assert link.exists(), f"dangling {link}"


def assert_same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))
