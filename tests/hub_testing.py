"""What the Hub tests share; the fixtures built on it (`hermetic_hub`, `hub_server`, `one_second`)
are in tests/conftest.py."""

from __future__ import annotations

import contextlib
import socket
import threading

import torch
from huggingface_hub import constants

import vitzoo

TOKEN = "test-token"
TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=8,
            num_classes=5)


def hermetic_hub_environment(monkeypatch, tmp_path) -> None:
    """A cache of our own, no stray token, no Xet uploads (the test server has no Xet storage)."""
    for name, value in {"HF_HUB_DISABLE_XET": True, "HF_HUB_OFFLINE": False,
                        "HF_HUB_CACHE": str(tmp_path / "hf_home" / "hub")}.items():
        monkeypatch.setattr(constants, name, value)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def tiny(seed: int = 0, **changes):
    """A tiny ViT-B/16-shaped model whose weights are drawn from `seed` (not the init's zeros)."""
    torch.manual_seed(seed)
    model = vitzoo.create("vit_b16", **{**TINY, **changes})
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model.eval()


def assert_same_model(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(a(x), b(x))


@contextlib.contextmanager
def loopback(answer):
    """A server on 127.0.0.1 that calls `answer(connection)` in a thread for each connection it
    accepts; yields its URL and closes them all at the end."""
    listener, held = socket.create_server(("127.0.0.1", 0)), []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])
                threading.Thread(target=answer, args=(held[-1],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()
        for connection in held:
            connection.close()


def within(seconds: float, call):
    """`call()`'s result, or its exception raised here; fails the test when it still waits after
    `seconds` (a bound far above the waits under test: a hang, not a slow machine)."""
    outcome = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
