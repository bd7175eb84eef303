"""`vitzoo train` and `vitzoo eval` as a user types them: the flags made from the config fields,
a run stopped, resumed and evaluated, errors as one line, and the documented command lines."""

import json
import re
import shlex
from pathlib import Path

import pytest
from train_testing import TINY, flags

from vitzoo.cli import build_parser, main
from vitzoo.commands.train import config_from_args

ROOT = Path(__file__).resolve().parents[1]


def test_model_and_part_options_come_from_the_config_fields():
    args = build_parser().parse_args([
        "train", "vit_ti16", "--img-size", "28", "--patch-size", "4", "--pos-embed", "learned_2d",
        "--pool", "gap", "--stem.layers", "2,2", "--stem", "resnet", "--drop-path", "0.1",
        "--dynamic-img-size", "--mean", "0.1,0.2,0.3", "--betas", "0.9,0.95", "--epochs", "2",
        "--hflip"])
    cfg = config_from_args(args)
    assert cfg.model_options == {"img_size": (28, 28), "patch_size": 4, "pos_embed": "learned_2d",
                                 "pool": "gap", "stem_options": {"layers": (2, 2)},
                                 "stem": "resnet", "drop_path": 0.1, "dynamic_img_size": True,
                                 "mean": (0.1, 0.2, 0.3)}
    assert (cfg.betas, cfg.epochs, cfg.hflip, cfg.lr, cfg.out) == ((0.9, 0.95), 2, True, None,
                                                                   "runs/vit_ti16")
    args = build_parser().parse_args(["train", "--stem.layers", "()", "--img-size", "32,48"])
    assert config_from_args(args).model_options == {"stem_options": {"layers": ()},
                                                    "img_size": (32, 48)}


def test_train_stop_resume_with_the_saved_settings_and_eval(tmp_path, capsys):
    run = tmp_path / "run"
    settings = dict(**TINY, data="synthetic", train_limit=256, test_limit=128, batch_size=32,
                    warmup=2, lr=3e-3, device="cpu", steps=6, stop_at=3)
    assert main(["train", "vit_ti16", "--quiet", "--no-tensorboard", "--out", str(run),
                 *flags(**settings)]) == 0
    assert json.loads((run / "summary.json").read_text())["status"] == "stopped"
    assert main(["train", "--resume", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["step"] == 6
    capsys.readouterr()
    assert main(["eval", str(run), "--fewshot", "1,5", "--draws", "2", "--test-limit", "100",
                 "--json", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["data"] == "synthetic" and result["test_images"] == 100  # the run's data
    assert set(result["fewshot"]) == {"1", "5"} and 0 <= result["test_top1"] <= 1
    assert main(["eval", str(run), "--test-limit", "50", "--device", "cpu"]) == 0
    assert "top-1" in capsys.readouterr().out


def test_a_users_mistake_is_a_one_line_error_or_a_usage_error(tmp_path, capsys):
    assert main(["train", "vit_ti16", "--data", "fashion-mnist", "--data-dir", str(tmp_path / "no"),
                 "--out", str(tmp_path / "run")]) == 2
    assert "vitzoo train: error: Fashion-MNIST: " in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    for wrong in (["--patch-sise", "4"], ["--recipe", "paper-nonsense"], ["--img-size", "a,b"]):
        with pytest.raises(SystemExit):
            main(["train", "vit_ti16", *wrong])
    assert main(["eval", str(tmp_path), "--data", "synthetic"]) == 2
    assert "has no weights file" in capsys.readouterr().err


def test_the_documented_command_lines_parse_into_valid_configs():
    """Every `vitzoo` line of the README's and docs' code blocks parses with today's flags, a
    train line into a valid TrainConfig."""
    trains = 0
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        code = False
        for line in doc.read_text().splitlines():
            code ^= line.startswith("```")
            if code and line.startswith("vitzoo "):
                command = re.sub(r"\[[^]]*\]|\.\.\.", "", line.partition("#")[0])
                args = build_parser().parse_args(shlex.split(command)[1:])
                if args.command == "train" and "resume" not in args:
                    trains += bool(config_from_args(args))
    assert trains >= 3
