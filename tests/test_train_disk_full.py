"""A full disk loses nothing: the error names the file, the space it needs and has, and what is
kept; the last good checkpoint stays whole and pointed to; nothing half-written is left; and
`--resume`, once space is free, finishes with the weights of a run that never met it. The writers
raise what a full disk makes them raise (safetensors' error, torch.save's OSError, RuntimeError)."""

from __future__ import annotations

import errno
import hashlib
import shutil
from collections import namedtuple

import pytest
import torch
from safetensors import SafetensorError
from train_testing import TINY, flags, tiny_config

from vitzoo.cli import main
from vitzoo.errors import DiskFull
from vitzoo.train import checkpoint, fit

SETTINGS = dict(train_limit=64, test_limit=32, batch_size=16, steps=4, warmup=1, checkpoint_every=2)


def weights_hash(run) -> str:
    return hashlib.sha256((run / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("whole")
    fit(tiny_config(root, **SETTINGS))
    return weights_hash(root / "run")


def fill_the_disk(monkeypatch, which: str) -> None:
    """The chosen write of step 4 (or of the final model) fails once as on a full disk."""
    from vitzoo.weights import native

    save_file, torch_save, failed = native.save_file, torch.save, []

    def safetensors_writer(tensors, filename, metadata=None):
        final = "checkpoints" not in filename
        if not failed and (which == "model" and final or which == "checkpoint" and not final
                           and "step_00000004" in filename):
            failed.append(filename)
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                                  'StorageFull, message: "No space left on device" })')
        return save_file(tensors, filename, metadata=metadata)

    def torch_writer(obj, f, *args, **kwargs):
        if not failed and which.startswith("state") and "step_00000004" in str(f):
            failed.append(f)
            if which == "state, said by torch's C++ writer":
                monkeypatch.setattr(shutil, "disk_usage", lambda path: namedtuple(
                    "usage", "total used free")(10**9, 10**9, 4096))
                raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 64")
            raise OSError(errno.ENOSPC, "No space left on device")
        return torch_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(native, "save_file", safetensors_writer)
    monkeypatch.setattr(torch, "save", torch_writer)


@pytest.mark.parametrize("which", ["checkpoint", "state", "state, said by torch's C++ writer",
                                   "model"])
def test_a_full_disk_is_said_keeps_the_last_checkpoint_and_resume_finishes(
        tmp_path, monkeypatch, which, uninterrupted):
    run = tmp_path / "run"
    fill_the_disk(monkeypatch, which)
    with pytest.raises(DiskFull) as info:
        fit(tiny_config(tmp_path, **SETTINGS))
    message, kept = str(info.value), "step_00000004" if which == "model" else "step_00000002"
    assert info.value.errno == errno.ENOSPC and f"vitzoo train --resume {run}" in message
    assert all(words in message for words in ("the disk is full", "it needs about", "MB are free"))
    assert (f"the trained model (model.safetensors) and summary.json" if which == "model"
            else "checkpoint step_00000004 (model.safetensors and state.pt)") in message
    assert f"the last good checkpoint, {kept}, is kept" in message
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", kept]
    assert checkpoint.latest(run / "checkpoints").name == kept
    assert not list(run.rglob("*.tmp")) and not (run / "summary.json").exists()
    monkeypatch.undo()  # space is free again
    assert fit(tiny_config(tmp_path, resume=True, **SETTINGS))["step"] == 4
    assert weights_hash(run) == uninterrupted


def test_a_full_disk_before_any_checkpoint_says_the_run_starts_again(tmp_path, monkeypatch, capsys):
    """With the end's checkpoint only, nothing is kept: the command says so in one line (exit 2)
    and `--resume` trains the run from its start."""
    run = tmp_path / "run"
    fill_the_disk(monkeypatch, "checkpoint")
    command = ["train", "vit_ti16", "--quiet", "--no-tensorboard", "--out", str(run)]
    settings = dict(SETTINGS, checkpoint_every=0, data="synthetic", device="cpu", **TINY)
    assert main([*command, *flags(**settings)]) == 2
    assert ("the disk is full" in (err := capsys.readouterr().err)
            and "no earlier checkpoint was written, so the run resumes from its start" in err)
    assert main(["train", "--resume", str(run)]) == 0 and (run / "summary.json").exists()
