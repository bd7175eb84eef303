"""A full disk at the end of a run loses nothing (issue 33 item 5): the error names the file, the space it
needs and has, and what is kept; the last good checkpoint stays whole and pointed to; nothing
half-written is left; and `--resume`, once space is free, finishes the run with the same weights as a
run that never met the full disk. The full disk is simulated: the writer raises what a full disk makes
it raise (safetensors' own error type for its files, OSError ENOSPC for torch.save's)."""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from vitzoo.cli import main
from vitzoo.errors import DiskFull
from vitzoo.train import TrainConfig, checkpoint, fit

TINY = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)


def config(out: Path, **changes) -> TrainConfig:
    base = dict(model="vit_ti16", model_options=dict(TINY), data="synthetic", train_limit=64, test_limit=32,
                batch_size=16, steps=4, lr=3e-3, warmup=1, log_every=1, checkpoint_every=2, quiet=True,
                tensorboard=False, device="cpu", out=str(out))  # exact equalities below are a CPU property
    return TrainConfig(**{**base, **changes})


def weights_hash(run: Path) -> str:
    return hashlib.sha256((run / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    run = tmp_path_factory.mktemp("whole") / "run"
    fit(config(run))
    return weights_hash(run)


class FullDisk:
    """Makes the chosen write fail as a full disk does, once, then lets everything through."""

    def __init__(self, monkeypatch, which: str) -> None:
        from vitzoo.weights import native

        self.failed = False
        save_file, torch_save = native.save_file, torch.save

        def safetensors_writer(tensors, filename, metadata=None):
            is_final = "checkpoints" not in filename
            if not self.failed and ((which == "checkpoint" and "step_00000004" in filename) or (which == "model" and is_final)):
                self.failed = True
                raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, "
                                      'message: "No space left on device" })')
            return save_file(tensors, filename, metadata=metadata)

        def torch_writer(obj, f, *args, **kwargs):
            if not self.failed and which == "state" and "step_00000004" in str(f):
                self.failed = True
                raise OSError(errno.ENOSPC, "No space left on device")
            return torch_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(native, "save_file", safetensors_writer)
        monkeypatch.setattr(torch, "save", torch_writer)


@pytest.mark.parametrize("which", ["checkpoint", "state", "model"])
def test_a_full_disk_at_the_end_is_said_keeps_the_last_checkpoint_and_resume_finishes(tmp_path, monkeypatch, which,
                                                                                     uninterrupted):
    run = tmp_path / "run"
    disk = FullDisk(monkeypatch, which)
    with pytest.raises(DiskFull) as info:
        fit(config(run))
    message = str(info.value)
    assert disk.failed and info.value.errno == errno.ENOSPC
    assert "the disk is full" in message and "MB are free there" in message and "it needs about" in message
    assert f"vitzoo train --resume {run}" in message
    if which == "model":  # the final checkpoint holds the trained weights
        assert "the trained model (model.safetensors) and summary.json" in message and "step_00000004, is kept" in message
        kept = "step_00000004"
    else:
        assert "checkpoint step_00000004 (model.safetensors and state.pt)" in message
        assert "step_00000002, is kept" in message
        kept = "step_00000002"
    checkpoints = run / "checkpoints"
    assert checkpoint.latest(checkpoints) == checkpoints / kept
    assert sorted(p.name for p in checkpoints.iterdir()) == sorted({kept, "latest"})  # nothing half-written
    assert not list(run.rglob("*.tmp")) and not (run / "summary.json").exists()

    summary = fit(config(run, resume=True))  # space is free again
    assert summary["status"] == "finished" and summary["step"] == 4
    assert weights_hash(run) == uninterrupted


def test_a_full_disk_before_any_checkpoint_says_the_run_starts_again_and_the_command_says_it(tmp_path, monkeypatch,
                                                                                            capsys):
    """With only the end's checkpoint (--checkpoint-every 0), nothing is kept: the error says the run
    resumes from its start, and the command exits 2 with it instead of a traceback."""
    run = tmp_path / "run"
    FullDisk(monkeypatch, "checkpoint")
    code = main(["train", "vit_ti16", "--data", "synthetic", "--train-limit", "64", "--test-limit", "32",
                 "--batch-size", "16", "--steps", "4", "--checkpoint-every", "0", "--device", "cpu", "--quiet",
                 "--no-tensorboard", "--out", str(run), *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]])
    err = capsys.readouterr().err
    assert code == 2 and "the disk is full" in err and "no earlier checkpoint was written, so the run resumes from its start" in err
    assert main(["train", "--resume", str(run)]) == 0
    assert (run / "summary.json").exists()
