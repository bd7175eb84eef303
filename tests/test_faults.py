"""Faults a hostile but fair user can cause (issue 14): nothing is lost, nothing is written outside
where it belongs, nothing hangs. One test per case; each docstring states the behaviour."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

import vitzoo
from vitzoo.config import ConfigError

TINY = dict(embed_dim=32, depth=2, num_heads=2, mlp_dim=64, img_size=32, patch_size=8, num_classes=5)


def tiny(seed: int = 0, **changes):
    torch.manual_seed(seed)
    model = vitzoo.create("vit_b16", **{**TINY, **changes})
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05)
    return model.eval()


def same_outputs(a, b) -> bool:
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        return a.config == b.config and torch.equal(a(x), b(x))


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (hidden ones too) and a hash of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ 1-2. save_pretrained: all or nothing
@pytest.mark.parametrize("card", [{"metrics": {"accuracy": None}}, {"metrics": {"accuracy": True}},
                                  {"metrics": {"accuracy": float("nan")}}, {"metrics": {"top1": "0.9"}},
                                  {"tags": "vit"}, {"licence": "mit"}])
def test_a_save_refused_for_its_card_writes_nothing(tmp_path, card):
    """A card option that is not what it should be (a metric that is no finite number, tags as one
    text, an unknown option) is a ConfigError raised before any file is written: no directory appears,
    nothing is left beside it."""
    with pytest.raises(ConfigError, match="card"):
        tiny().save_pretrained(tmp_path / "saved", card=card)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_save_over_an_earlier_save_leaves_it_whole(tmp_path):
    """A save that fails (here: a bad card metric) into a directory holding an earlier save leaves every
    byte of the earlier save in place, and it loads as the model that was saved."""
    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError):
        tiny(1, num_heads=4, act="gelu_tanh").save_pretrained(tmp_path / "saved", card={"metrics": {"accuracy": None}})
    assert snapshot(tmp_path) == before
    assert same_outputs(vitzoo.from_pretrained(tmp_path / "saved").eval(), first)


def test_a_failed_write_during_a_save_leaves_the_earlier_save_whole(tmp_path, monkeypatch):
    """A failure while the files are written (a full disk, a kill) leaves the earlier save whole: the
    new files are written beside the directory and only then put in place together."""
    from vitzoo.weights import files

    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)

    def disk_full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "write_text", disk_full)
    with pytest.raises(OSError, match="No space"):
        tiny(1).save_pretrained(tmp_path / "saved")
    assert snapshot(tmp_path) == before
    assert same_outputs(vitzoo.from_pretrained(tmp_path / "saved").eval(), first)


def test_a_save_replaces_an_earlier_save_whole(tmp_path):
    """A save that succeeds over an earlier one holds exactly the new model's three files."""
    tiny(0).save_pretrained(tmp_path / "saved", card={"dataset": "cifar10", "metrics": {"accuracy": 0.5}})
    second = tiny(1, num_heads=4)
    second.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    assert "cifar10" not in (tmp_path / "saved" / "README.md").read_text()
    assert same_outputs(vitzoo.from_pretrained(tmp_path / "saved").eval(), second)


def test_a_save_into_a_directory_holding_more_keeps_the_rest(tmp_path):
    """Saving into a directory that holds other files (as a training run does) replaces the model's
    files and keeps the others."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    tiny(0).save_pretrained(tmp_path / "run")
    model = tiny(1)
    model.save_pretrained(tmp_path / "run")
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == "{}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert same_outputs(vitzoo.from_pretrained(tmp_path / "run").eval(), model)
