"""Nothing a user has is overwritten: `vitzoo convert SRC DIR`, `vitzoo pull REPO DIR` and
`vitzoo train --out DIR` write only into a new or empty directory (a run also resumes into its
own). Each refusal names what the directory holds and leaves every byte of it in place."""

from __future__ import annotations

from pathlib import Path

import pytest
from hub_testing import TOKEN, tiny  # tests/hub_testing.py
from train_testing import short_config, snapshot  # tests/train_testing.py

from vitzoo.cli import main
from vitzoo.train import fit

MODEL_FILES = ["README.md", "config.json", "model.safetensors"]


def holding(tmp_path: Path, what: str) -> Path:
    """A directory holding the user's notes, a finished run, a saved model, or a file itself."""
    where = tmp_path / what
    if what == "notes":
        where.mkdir()
        (where / "README.md").write_text("my notes\n")
    elif what == "run":
        fit(short_config(where, steps=1, warmup=0))
    elif what == "saved model":
        tiny(1).save_pretrained(where)
    else:
        where.write_text("mine\n")
    return where


SAID = {"notes": "already holds README.md;", "run": "already holds README.md, checkpoints",
        "saved model": "already holds README.md, config.json, model.safetensors;",
        "file": "is a file, not a directory"}


def test_convert_pull_and_train_refuse_a_directory_that_holds_something(hub_server, tmp_path,
                                                                        capsys):
    tiny().save_pretrained(tmp_path / "source")
    tiny().push_to_hub("alice/model", token=TOKEN)
    for what in sorted(SAID):
        target = holding(tmp_path, what)
        before = snapshot(tmp_path)
        for argv in (["convert", str(tmp_path / "source")], ["pull", "alice/model"],
                     ["train", "vit_ti16", "--data", "synthetic", "--device", "cpu", "--out"]):
            assert main([*argv, str(target)]) == 2, (what, argv)
            err = capsys.readouterr().err
            assert SAID[what] in err and "Traceback" not in err, (what, argv, err)
        assert snapshot(tmp_path) == before


@pytest.mark.parametrize("given", ["directory", "weights file"])
def test_a_source_is_never_written_over(tmp_path, capsys, given):
    """`convert SRC SRC` and `train --pretrained SRC --out SRC` would replace what they read."""
    tiny().save_pretrained(tmp_path / "src")
    source = tmp_path / "src" / ("model.safetensors" if given == "weights file" else "")
    before = snapshot(tmp_path)
    assert main(["convert", str(source), str(tmp_path / "src")]) == 2
    assert "already holds README.md, config.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match="already holds README.md, config.json"):
        fit(short_config(tmp_path / "src", pretrained=str(source)))
    assert snapshot(tmp_path) == before


def test_a_new_or_empty_directory_is_written(tmp_path):
    tiny().save_pretrained(tmp_path / "source")
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "new" / "deeper"):
        assert main(["convert", str(tmp_path / "source"), str(out)]) == 0
        assert sorted(p.name for p in out.iterdir()) == MODEL_FILES
    (tmp_path / "run").mkdir()
    assert fit(short_config(tmp_path / "run"))["status"] == "finished"
