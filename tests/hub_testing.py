"""What the Hub tests share: a hermetic Hugging Face environment and a tiny model with random weights."""

from __future__ import annotations

import torch
from huggingface_hub import constants

import vitzoo

TOKEN = "test-token"
TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=8, num_classes=5)


def hermetic_hub_environment(monkeypatch, tmp_path) -> None:
    """A cache of our own, no stray token, LFS uploads (the test server has no Xet storage)."""
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
