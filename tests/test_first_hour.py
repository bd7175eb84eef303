"""The first hour's stumbles of issue 35 that training meets: a resume with nothing to resume says so
(item 3), checkpoints come at least at each epoch's end and by time (item 3), and a missing tensorboard
is said once while metrics.csv holds the numbers (item 6)."""

from __future__ import annotations

import csv
import json
import sys

import pytest

from tests.test_train import tiny_config
from vitzoo.train import fit, loop
from vitzoo.train import metrics as metrics_module


def test_a_resume_with_no_checkpoint_says_it_starts_from_step_0(tmp_path, capsys):
    """A run stopped before its first checkpoint holds train_config.json and nothing to resume: the
    resume trains from step 0, and says so (quiet or not)."""
    loop.Trainer.from_config(tiny_config(tmp_path, steps=2, warmup=1))  # set up, never trained: its settings alone
    assert (tmp_path / "run" / "train_config.json").exists() and not (tmp_path / "run" / "checkpoints").exists()
    summary = fit(tiny_config(tmp_path, steps=2, warmup=1, resume=True))
    assert summary["status"] == "finished" and summary["step"] == 2
    assert f"no checkpoint in {tmp_path / 'run'}: starting from step 0" in capsys.readouterr().err


def test_checkpoints_come_at_each_epochs_end_and_by_time_whichever_first(tmp_path):
    """256 images in batches of 32: 8 steps an epoch, shorter than --checkpoint-every's 1000."""
    trainer = loop.Trainer.from_config(tiny_config(tmp_path, steps=12, checkpoint_every=1000, checkpoint_every_min=10))
    trainer._start_loop()
    due = {}
    for step, seconds in ((5, 0.0), (8, 0.0), (16, 0.0), (5, 599.0), (5, 600.0), (1000, 0.0)):
        trainer.step, trainer.train_seconds = step, seconds
        due[step, seconds] = trainer.checkpoint_due()
    assert due == {(5, 0.0): False, (8, 0.0): True, (16, 0.0): True, (5, 599.0): False, (5, 600.0): True,
                   (1000, 0.0): True}
    trainer.last_checkpoint_s = 600.0  # counted from the last checkpoint
    trainer.step, trainer.train_seconds = 5, 900.0
    assert not trainer.checkpoint_due()
    trainer.cfg.checkpoint_every = 0  # the end's checkpoint only, as before
    trainer.step = 8
    assert not trainer.checkpoint_due()
    # and in a run: the epoch's end (step 8) and the end (12) are checkpointed
    summary = fit(tiny_config(tmp_path / "run2", steps=12, checkpoint_every=1000, keep_checkpoints=5))
    assert summary["status"] == "finished"
    kept = sorted(p.name for p in (tmp_path / "run2" / "run" / "checkpoints").glob("step_*"))
    assert kept == ["step_00000008", "step_00000012"]


def test_a_missing_tensorboard_is_said_once_and_metrics_csv_holds_the_numbers(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # not installed, whatever this machine has
    monkeypatch.setattr(metrics_module, "_warned", False)
    with pytest.warns(UserWarning, match=r"tensorboard is not installed.*pip install tensorboard"):
        first = metrics_module.Metrics(tmp_path, enabled=True, resume_step=0, tensorboard=True)
    first.write({"step": 1, "loss": 2.5, "lr": 0.1})
    first.write({"step": 2, "loss": 2.25, "lr": 0.2})
    first.write({"step": 2, "val_top1": 0.5, "val_loss": 2.0})  # a new column: the table is written again
    first.write({"step": 3, "loss": 2.0, "lr": 0.3})
    first.close()
    with (tmp_path / "metrics.csv").open(newline="") as table:
        rows = list(csv.DictReader(table))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert list(rows[0]) == ["step", "loss", "lr", "val_top1", "val_loss"] and len(rows) == len(lines) == 4
    assert all({k: str(v) for k, v in line.items()} == {k: v for k, v in row.items() if v != ""}
               for line, row in zip(lines, rows))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process, not once per run
        second = metrics_module.Metrics(tmp_path / "again", enabled=True, resume_step=0, tensorboard=True)
    second.close()
    # a resumed run's table keeps the lines its checkpoint had seen
    metrics_module.Metrics(tmp_path, enabled=True, resume_step=2, tensorboard=False).close()
    with (tmp_path / "metrics.csv").open(newline="") as table:
        assert [row["step"] for row in csv.DictReader(table)] == ["1", "2", "2"]


def test_the_readmes_commands_parse_and_each_says_how_long_it_takes():
    """Every `vitzoo` line of the README's command-line block parses with today's flags (a train line also
    into a valid TrainConfig), and says how long it takes, on its line or in the comment line above it
    (issue 35 item 4); the first training example is the small ViT, which takes minutes, not ViT-Ti."""
    import re
    import shlex
    from pathlib import Path

    from vitzoo.cli import build_parser
    from vitzoo.commands.train import config_from_args

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"## Command line\n\n```\n(.*?)```", readme, re.S).group(1).splitlines()
    duration = re.compile(r"\d+(\.\d+)?\s?(s|min|h)\b|seconds|as long as")  # "as long as": the network or disk decides
    trains = []
    for above, line in zip([""] + block, block):
        if not line.startswith("vitzoo "):
            continue
        command, _, comment = line.partition("#")
        assert duration.search(comment) or (above.startswith("#") and duration.search(above)), f"no time: {line}"
        args = build_parser().parse_args(shlex.split(re.sub(r"\[[^]]*\]", "", command))[1:])
        if args.command == "train":
            trains.append(config_from_args(args))
    assert len(trains) >= 2
    first = trains[0]
    assert first.data == "fashion-mnist" and first.epochs == 1 and first.model_options["depth"] == 4
    assert first.model_options["embed_dim"] == 64
