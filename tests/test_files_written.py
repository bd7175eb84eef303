"""Files vitzoo writes are written all or nothing: a save refused or failed keeps every byte of the
earlier save, a save killed in its swap is repaired by the next one, and a write that fails names
its destination and blames the folder or the disk, not a temporary file or the network. Files get
the permissions the user's umask gives."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hub_testing import assert_same_model, tiny  # tests/hub_testing.py
from train_testing import short_config, snapshot  # tests/train_testing.py

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import ConfigError, DataError
from vitzoo.train import fit


@pytest.mark.parametrize("card", [{"metrics": {"accuracy": None}}, {"metrics": {"accuracy": True}},
                                  {"metrics": {"accuracy": float("nan")}},
                                  {"metrics": {"top1": "0.9"}},
                                  {"tags": "vit"}, {"licence": "mit"}])
def test_a_save_refused_for_its_card_writes_nothing(tmp_path, card):
    """A card option that is not what it should be (a metric that is no finite number, tags as one
    text, an unknown option) is a ConfigError raised before any file is written: no directory
    appears, nothing is left beside it."""
    with pytest.raises(ConfigError, match="card"):
        tiny().save_pretrained(tmp_path / "saved", card=card)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_save_over_an_earlier_save_leaves_it_whole(tmp_path):
    """A save that fails (here: a bad card metric) into a directory holding an earlier save leaves
    every byte of the earlier save in place, and it loads as the model that was saved."""
    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)
    with pytest.raises(ConfigError):
        tiny(1, num_heads=4, act="gelu_tanh").save_pretrained(tmp_path / "saved",
                                                              card={"metrics": {"accuracy": None}})
    assert snapshot(tmp_path) == before
    assert_same_model(vitzoo.from_pretrained(tmp_path / "saved").eval(), first)


def test_a_failed_write_during_a_save_leaves_the_earlier_save_whole(tmp_path, monkeypatch):
    """A failure while the files are written (a full disk, a kill) leaves the earlier save whole:
    the new files are written beside the directory and only then put in place together."""
    from vitzoo.weights import native

    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)

    def disk_full(path, text):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(native, "write_text", disk_full)
    with pytest.raises(OSError, match="No space"):
        tiny(1).save_pretrained(tmp_path / "saved")
    assert snapshot(tmp_path) == before
    assert_same_model(vitzoo.from_pretrained(tmp_path / "saved").eval(), first)


def test_a_save_replaces_an_earlier_save_whole(tmp_path):
    """A save that succeeds over an earlier one holds exactly the new model's three files."""
    tiny(0).save_pretrained(tmp_path / "saved",
                            card={"dataset": "cifar10", "metrics": {"accuracy": 0.5}})
    second = tiny(1, num_heads=4)
    second.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["README.md", "config.json",
                                                                      "model.safetensors"]
    assert "cifar10" not in (tmp_path / "saved" / "README.md").read_text()
    assert_same_model(vitzoo.from_pretrained(tmp_path / "saved").eval(), second)


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
    assert_same_model(vitzoo.from_pretrained(tmp_path / "run").eval(), model)


def crash_in_the_swap(directory: Path, seed: int) -> None:
    """save_pretrained over an earlier save in another process, killed (os._exit) between the swap's
    two renames: the earlier save is moved aside, the new one not yet in place."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from hub_testing import tiny
        import vitzoo.io as io
        renames, real = [], os.rename
        def rename(src, dst):
            renames.append(src)
            if len(renames) == 2:
                os._exit(9)  # killed between the two renames
            real(src, dst)
        io.os.rename = rename
        tiny({seed}).save_pretrained({str(directory)!r})
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 9, result.stderr


def test_a_crash_between_the_two_renames_of_a_swap_is_recovered_at_the_next_save(tmp_path):
    """The directory is missing after the crash; loading it says where the earlier save is; the next
    save puts the new model in place and leaves no staging or moved-aside directory behind."""
    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    crash_in_the_swap(tmp_path / "saved", seed=1)
    assert not (tmp_path / "saved").exists()
    with pytest.raises(FileNotFoundError,
                       match=r"an interrupted save left the earlier one in .*\.saved\..*\.old"):
        vitzoo.from_pretrained(tmp_path / "saved")
    second = tiny(2)
    second.save_pretrained(tmp_path / "saved")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    assert_same_model(vitzoo.from_pretrained(tmp_path / "saved"), second)


def test_a_crash_in_the_swap_then_a_failed_save_brings_the_earlier_save_back(tmp_path):
    """When the next save fails, the directory holds the earlier save again (restored from where the
    crash left it), whole and loadable."""
    first = tiny(0)
    first.save_pretrained(tmp_path / "saved")
    crash_in_the_swap(tmp_path / "saved", seed=1)
    with pytest.raises(ConfigError):
        tiny(3).save_pretrained(tmp_path / "saved", card={"metrics": {"accuracy": None}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]
    assert_same_model(vitzoo.from_pretrained(tmp_path / "saved"), first)


def test_a_write_that_cannot_start_names_the_destination_not_a_temporary_file(tmp_path, capsys):
    from vitzoo.io import write_text

    tiny().save_pretrained(tmp_path / "saved")
    assert main(["convert", str(tmp_path / "saved"), "/proc/vitzoo-convert"]) == 2
    err = capsys.readouterr().err
    assert "/proc/vitzoo-convert" in err and ".tmp" not in err
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError) as info:
        write_text(tmp_path / "file" / "x.json", "{}")
    assert str(tmp_path / "file" / "x.json") in str(info.value) and ".tmp" not in str(info.value)


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
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda path: namedtuple("usage", "total used free")(10**9, 10**9, 4096))
    with pytest.raises(OSError,
                       match=r"the disk is full: checkpoint step_00000002 \(model.safetensors and "
                             r"state.pt\).*"
                                      r"0.0 MB are free there.*the last good checkpoint, "
                                      r"step_00000001, is kept"):
        checkpoint.save(tmp_path / "checkpoints", 2, model, {"step": 2})
    assert checkpoint.latest(tmp_path / "checkpoints").name == "step_00000001"


@pytest.mark.parametrize("where", ["a file", "/sys"])
def test_a_download_into_a_folder_it_cannot_write_blames_the_folder_not_the_network(
        tmp_path, where, monkeypatch):
    from vitzoo.data import named
    monkeypatch.setattr(named, "torchvision_class",
                        lambda name: pytest.fail("a download was tried"))
    target = tmp_path / "afile" if where == "a file" else Path("/sys/vitzoo-datasets")
    if where == "a file":
        target.write_text("not a folder")
    with pytest.raises(DataError,
                       match=r"cannot download cifar10 into .*(a file, not a folder|cannot be "
                             r"created|cannot write)") as info:
        named.download("cifar10", target)
    assert "network" not in str(info.value)


def test_a_download_that_fills_the_disk_blames_the_disk(tmp_path, monkeypatch):
    import errno

    from vitzoo.data import named
    from torchvision.datasets import CIFAR10

    class Full(CIFAR10):  # torchvision's class, whose download meets a full disk
        def __init__(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(named, "torchvision_class", lambda name: Full)
    with pytest.raises(DataError,
                       match="the folder or its disk is at fault, not the network: free some space"):
        named.download("cifar10", tmp_path)


@pytest.fixture
def umask():
    import os

    def set_umask(mask: int) -> None:
        os.umask(mask)

    before = os.umask(0o022)
    os.umask(before)
    yield set_umask
    os.umask(before)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_files_vitzoo_writes_get_the_users_umask(tmp_path, umask, mask):
    """save_pretrained's files, a training run's files and checkpoints, and an atomic write have the
    permissions any tool's files get under the umask (0o666 & ~umask), not tempfile's 0o600."""
    from vitzoo.io import write_text

    umask(mask)
    expected = 0o666 & ~mask
    tiny().save_pretrained(tmp_path / "saved")
    fit(short_config(tmp_path / "run", steps=1, warmup=0))
    write_text(tmp_path / "note.txt", "x\n")
    files = [p for p in [*(tmp_path / "saved").iterdir(), *(tmp_path / "run").rglob("*"),
                         tmp_path / "note.txt"]
             if p.is_file()]
    assert len(files) > 8
    wrong = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in files
             if p.stat().st_mode & 0o777 != expected}
    assert not wrong, f"expected {oct(expected)}: {wrong}"
