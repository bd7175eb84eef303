"""Nothing a user has is overwritten (issue 23): `vitzoo convert` and `vitzoo pull DIR` write only into
a new or empty directory, the rule `vitzoo train --out` follows (vitzoo.train.checkpoint), and files
vitzoo writes get the permissions the user's umask gives."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hub_testing import TOKEN, tiny  # tests/hub_testing.py

from vitzoo.cli import main


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def saved(tmp_path) -> Path:
    tiny().save_pretrained(tmp_path / "saved")
    return tmp_path / "saved"


def finished_run(out: Path) -> Path:
    from vitzoo.train import TrainConfig, fit

    fit(TrainConfig(model="vit_ti16", model_options=dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28,
                                                         patch_size=7), data="synthetic", train_limit=32, test_limit=16,
                    batch_size=16, steps=1, warmup=0, log_every=1, checkpoint_every=0, quiet=True, tensorboard=False,
                    out=str(out), device="cpu"))
    return out


# ------------------------------------------------------------------ 7. convert and pull DIR: new or empty directories only
def test_convert_into_a_directory_holding_a_readme_keeps_it(tmp_path, saved, capsys):
    """`vitzoo convert SRC DIR` with DIR holding the user's README.md is refused in one line naming it;
    the README is kept byte for byte and nothing else is written."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "README.md").write_text("my notes\n")
    before = snapshot(tmp_path)
    assert main(["convert", str(saved), str(tmp_path / "mine")]) == 2
    err = capsys.readouterr().err
    assert "already holds files of its own (README.md)" in err and "empty or new directory" in err
    assert snapshot(tmp_path) == before


def test_convert_into_a_finished_training_run_keeps_it(tmp_path, saved, capsys):
    """A finished run's model.safetensors and config.json are not replaced by a convert into it."""
    run = finished_run(tmp_path / "run")
    before = snapshot(run)
    assert main(["convert", str(saved), str(run)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert snapshot(run) == before


@pytest.mark.parametrize("source", ["directory", "weights file"])
def test_convert_onto_its_own_source_is_refused(saved, capsys, source):
    """`vitzoo convert SRC SRC` (or SRC/model.safetensors SRC) would replace what it reads: refused,
    naming the source."""
    before = snapshot(saved)
    given = saved if source == "directory" else saved / "model.safetensors"
    assert main(["convert", str(given), str(saved)]) == 2
    assert "already holds the source being converted" in capsys.readouterr().err
    assert snapshot(saved) == before


def test_convert_into_a_directory_holding_a_saved_model_is_refused(tmp_path, saved, capsys):
    """Another saved model is not replaced either: train --out refuses it, and so does convert."""
    tiny(1).save_pretrained(tmp_path / "other")
    before = snapshot(tmp_path / "other")
    assert main(["convert", str(saved), str(tmp_path / "other")]) == 2
    assert "already holds a saved model" in capsys.readouterr().err
    assert snapshot(tmp_path / "other") == before


def test_convert_into_a_new_or_empty_directory_writes_the_model(tmp_path, saved):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new" / "deeper"):
        assert main(["convert", str(saved), str(out)]) == 0
        assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]


@pytest.fixture
def hub(hub_server):
    """The loopback Hub (tests/conftest.py) holding alice/model."""
    tiny().push_to_hub("alice/model", token=TOKEN)
    return hub_server


def test_pull_into_a_directory_holding_a_readme_or_a_run_keeps_them(hub, tmp_path, capsys):
    """`vitzoo pull REPO DIR` into a directory holding the user's README.md, or a finished run, is
    refused before anything is downloaded; everything there is kept."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "README.md").write_text("my notes\n")
    run = finished_run(tmp_path / "run")
    before = snapshot(tmp_path / "mine"), snapshot(run)
    assert main(["pull", "alice/model", str(tmp_path / "mine")]) == 2
    assert "already holds files of its own (README.md)" in capsys.readouterr().err
    assert main(["pull", "alice/model", str(run)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (snapshot(tmp_path / "mine"), snapshot(run)) == before
    assert main(["pull", "alice/model", str(tmp_path / "fresh")]) == 0
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == ["README.md", "config.json", "model.safetensors"]


# ------------------------------------------------------------------ the user's umask
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
    finished_run(tmp_path / "run")
    write_text(tmp_path / "note.txt", "x\n")
    files = [p for p in [*(tmp_path / "saved").iterdir(), *(tmp_path / "run").rglob("*"), tmp_path / "note.txt"]
             if p.is_file()]
    assert len(files) > 8
    wrong = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in files
             if p.stat().st_mode & 0o777 != expected}
    assert not wrong, f"expected {oct(expected)}: {wrong}"
