"""Nothing a user has is overwritten: `vitzoo convert DIR`, `vitzoo pull REPO DIR` and
`vitzoo train --out DIR` write only into a new or empty directory (a training run also resumes into
its own). Each refusal names what the directory holds and leaves every byte of it in place."""

from __future__ import annotations

from pathlib import Path

import pytest
from hub_testing import TOKEN, tiny  # tests/hub_testing.py
from train_testing import TINY, short_config, snapshot  # tests/train_testing.py

import vitzoo
from vitzoo.cli import main
from vitzoo.train import fit


@pytest.fixture
def saved(tmp_path) -> Path:
    tiny().save_pretrained(tmp_path / "saved")
    return tmp_path / "saved"


def test_convert_into_a_directory_holding_a_readme_keeps_it(tmp_path, saved, capsys):
    """`vitzoo convert SRC DIR` with DIR holding the user's README.md is refused in one line naming
    it; the README is kept byte for byte and nothing else is written."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "README.md").write_text("my notes\n")
    before = snapshot(tmp_path)
    assert main(["convert", str(saved), str(tmp_path / "mine")]) == 2
    err = capsys.readouterr().err
    assert "already holds files of its own (README.md)" in err and "empty or new directory" in err
    assert snapshot(tmp_path) == before


def test_convert_into_a_finished_training_run_keeps_it(tmp_path, saved, capsys):
    """A finished run's model.safetensors and config.json are not replaced by a convert into it."""
    run = tmp_path / "run"
    fit(short_config(run, steps=1, warmup=0))
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
        assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json",
                                                         "model.safetensors"]


def test_convert_onto_an_existing_file_is_a_one_line_error(tmp_path, capsys):
    """`vitzoo convert SRC DST` with DST an existing file says DST is a file; the file is kept."""
    tiny().save_pretrained(tmp_path / "saved")
    (tmp_path / "taken").write_text("mine\n")
    assert main(["convert", str(tmp_path / "saved"), str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "taken is a file, not a directory" in err and "Traceback" not in err
    assert (tmp_path / "taken").read_text() == "mine\n"


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
    run = tmp_path / "run"
    fit(short_config(run, steps=1, warmup=0))
    before = snapshot(tmp_path / "mine"), snapshot(run)
    assert main(["pull", "alice/model", str(tmp_path / "mine")]) == 2
    assert "already holds files of its own (README.md)" in capsys.readouterr().err
    assert main(["pull", "alice/model", str(run)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (snapshot(tmp_path / "mine"), snapshot(run)) == before
    assert main(["pull", "alice/model", str(tmp_path / "fresh")]) == 0
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == ["README.md", "config.json",
                                                                      "model.safetensors"]


def test_pull_onto_an_existing_file_is_a_one_line_error(
        hermetic_hub, tmp_path, capsys, monkeypatch):
    """`vitzoo pull REPO DIR` with DIR an existing file says DIR is a file; the file is kept."""
    from hubserver import HubServer

    with HubServer(hermetic_hub / "hub", token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        tiny().push_to_hub("alice/file", token=TOKEN)
        (tmp_path / "taken").write_text("mine\n")
        assert main(["pull", "alice/file", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "taken is a file, not a directory" in err and "Traceback" not in err
    assert (tmp_path / "taken").read_text() == "mine\n"


def test_training_refuses_an_out_that_holds_a_saved_model(tmp_path):
    """`--out` onto a save_pretrained directory is refused, naming the saved model; its files are
    kept byte for byte."""
    tiny().save_pretrained(tmp_path / "saved")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match=r"--out .*saved already holds a saved model"):
        fit(short_config(tmp_path / "saved"))
    assert snapshot(tmp_path) == before


def test_training_refuses_an_out_that_is_its_pretrained_source(tmp_path):
    """`--pretrained DIR --out DIR` (or an --out holding the --pretrained file) is refused, naming
    the source, before anything is written."""
    vitzoo.create("vit_ti16", **TINY, num_classes=10).save_pretrained(tmp_path / "source")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="already holds the --pretrained source"):
        fit(short_config(tmp_path / "source", pretrained=str(tmp_path / "source")))
    with pytest.raises(ValueError, match="already holds the --pretrained source"):
        fit(short_config(tmp_path / "source",
                         pretrained=str(tmp_path / "source" / "model.safetensors")))
    assert snapshot(tmp_path) == before


def test_training_refuses_an_out_that_holds_other_files(tmp_path):
    """`--out` onto a directory holding files of its own names them and keeps them."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me\n")
    with pytest.raises(ValueError, match=r"already holds files of its own \(todo.txt\)"):
        fit(short_config(tmp_path / "notes"))
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me\n"


def test_train_onto_an_existing_file_is_a_one_line_error(tmp_path, capsys):
    """`vitzoo train --out FILE` says FILE is a file; the file is kept."""
    (tmp_path / "taken").write_text("mine\n")
    assert main(["train", "vit_ti16", "--data", "synthetic", "--device", "cpu", "--out",
                 str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "Traceback" not in err
    assert (tmp_path / "taken").read_text() == "mine\n"


def test_training_into_an_empty_out_directory_runs(tmp_path):
    """An existing empty --out directory is fine for a new run."""
    (tmp_path / "empty").mkdir()
    assert fit(short_config(tmp_path / "empty"))["status"] == "finished"


def test_a_directory_that_is_not_empty_is_refused_in_plain_words(tmp_path, capsys):
    """The refusal of a directory that is not empty ends by saying to choose another."""
    from vitzoo.train.checkpoint import check_new_directory

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError) as refused:
        check_new_directory(tmp_path, "the directory", writer="pull writes only into")
    assert str(refused.value).endswith("choose another directory")
    assert "another the" not in str(refused.value)
    with pytest.raises(ValueError, match="choose another --out$"):
        check_new_directory(tmp_path, "--out", writer="a new run needs")
