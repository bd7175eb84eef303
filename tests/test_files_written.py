"""Files vitzoo writes are written all or nothing: a save refused or failed keeps every byte of the
earlier save, and a write that fails names its destination and blames the folder or the disk, not
a temporary file or the network. Files get the permissions the user's umask gives."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hub_testing import assert_same_model, tiny  # tests/hub_testing.py
from train_testing import short_config, snapshot  # tests/train_testing.py

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import ConfigError, DataError
from vitzoo.io import write_text
from vitzoo.train import fit


@pytest.mark.parametrize("card", [{"metrics": {"accuracy": float("nan")}}, {"licence": "mit"}])
def test_a_save_refused_for_its_card_writes_nothing_and_keeps_an_earlier_save(tmp_path, card):
    with pytest.raises(ConfigError, match="card"):
        tiny().save_pretrained(tmp_path / "new", card=card)
    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError):
        tiny(1, num_heads=4).save_pretrained(tmp_path / "saved", card=card)
    assert snapshot(tmp_path) == before and not (tmp_path / "new").exists()
    assert_same_model(vitzoo.from_pretrained(tmp_path / "saved").eval(), first)


def test_a_failed_write_during_a_save_leaves_the_earlier_save_whole(tmp_path, monkeypatch):
    from vitzoo.weights import native

    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)

    def disk_full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(native, "write_text", disk_full)
    with pytest.raises(OSError, match="No space"):
        tiny(1).save_pretrained(tmp_path / "saved")
    assert snapshot(tmp_path) == before
    assert_same_model(vitzoo.from_pretrained(tmp_path / "saved").eval(), first)


def test_a_save_replaces_a_save_whole_and_keeps_a_runs_other_files(tmp_path):
    tiny(0).save_pretrained(tmp_path / "saved", card={"dataset": "cifar10"})
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    for seed in (0, 1):
        for where in ("saved", "run"):
            (model := tiny(seed, num_heads=4)).save_pretrained(tmp_path / where)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run", "saved"]
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["README.md", "config.json",
                                                                      "model.safetensors"]
    assert "cifar10" not in (tmp_path / "saved" / "README.md").read_text()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == "{}\n"
    for where in ("saved", "run"):
        assert_same_model(vitzoo.from_pretrained(tmp_path / where).eval(), model)


def test_a_write_that_cannot_start_names_the_destination_not_a_temporary_file(tmp_path, capsys):
    tiny().save_pretrained(tmp_path / "saved")
    assert main(["convert", str(tmp_path / "saved"), "/proc/vitzoo-convert"]) == 2
    err = capsys.readouterr().err
    assert "/proc/vitzoo-convert" in err and ".tmp" not in err
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError, match=str(tmp_path / "file" / "x.json")) as info:
        write_text(tmp_path / "file" / "x.json", "{}")
    assert ".tmp" not in str(info.value)


@pytest.mark.parametrize("where", ["a file", "/sys", "a full disk"])
def test_a_download_that_cannot_write_blames_the_folder_or_disk_not_the_network(
        tmp_path, where, monkeypatch):
    import socket

    import torchvision.datasets

    from vitzoo.data import named

    class Full(torchvision.datasets.CIFAR10):  # torchvision's class, meeting a full disk
        def __init__(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

    if where == "a full disk":
        monkeypatch.setattr(torchvision.datasets, "CIFAR10", Full)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("downloaded"))
    target = {"a file": tmp_path / "afile", "/sys": Path("/sys/vitzoo-datasets")}.get(where,
                                                                                     tmp_path)
    if where == "a file":
        target.write_text("not a folder")
    with pytest.raises(DataError, match=r"cifar10 in .*; the folder or its disk is at fault, "
                                        r"not the network"):
        named.download("cifar10", target)


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_files_vitzoo_writes_get_the_users_umask(tmp_path, mask):
    """save_pretrained's files, a run's files and checkpoints, and an atomic write have the
    permissions any tool's files get (0o666 & ~umask), not tempfile's 0o600."""
    before = os.umask(mask)
    try:
        tiny().save_pretrained(tmp_path / "saved")
        fit(short_config(tmp_path / "run", steps=1, warmup=0))
        write_text(tmp_path / "note.txt", "x\n")
    finally:
        os.umask(before)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) > 8
    assert {str(p): oct(p.stat().st_mode & 0o777) for p in files
            if p.stat().st_mode & 0o777 != 0o666 & ~mask} == {}
