"""`vitzoo train` and `vitzoo eval` end to end on a tiny run; the generic model-option flags."""

import json

import pytest

from vitzoo.cli import build_parser, main
from vitzoo.commands.train import config_from_args

TINY = ["--embed-dim", "32", "--depth", "2", "--num-heads", "2", "--mlp-dim", "64", "--img-size", "28", "--patch-size", "7"]
DATA = ["--data", "synthetic", "--train-limit", "256", "--test-limit", "128", "--batch-size", "32", "--warmup", "2",
        "--lr", "3e-3", "--quiet", "--no-tensorboard", "--device", "cpu"]


def test_model_options_come_from_the_config_fields():
    args = build_parser().parse_args(["train", "vit_ti16", "--img-size", "28", "--patch-size", "4", "--pos-embed", "learned_2d",
                                      "--pool", "gap", "--resnet-layers", "2,2", "--stem", "resnet", "--drop-path", "0.1",
                                      "--representation-size", "none", "--dynamic-img-size", "--mean", "0.1,0.2,0.3",
                                      "--betas", "0.9,0.95", "--epochs", "2", "--hflip"])
    cfg = config_from_args(args)
    assert cfg.model_options == {"img_size": (28, 28), "patch_size": 4, "pos_embed": "learned_2d", "pool": "gap",
                                 "resnet_layers": (2, 2), "stem": "resnet", "drop_path": 0.1, "representation_size": None,
                                 "dynamic_img_size": True, "mean": (0.1, 0.2, 0.3)}
    assert cfg.betas == (0.9, 0.95) and cfg.epochs == 2 and cfg.hflip is True and cfg.lr is None
    assert cfg.out == "runs/vit_ti16"
    args = build_parser().parse_args(["train", "--resnet-layers", "()", "--img-size", "32,48"])  # "" is refused: no value
    assert config_from_args(args).model_options == {"resnet_layers": (), "img_size": (32, 48)}


def test_train_resume_and_eval(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "vit_ti16", *TINY, *DATA, "--steps", "6", "--stop-at", "3", "--log-every", "1", "--out", str(run)]) == 0
    assert json.loads((run / "summary.json").read_text())["status"] == "stopped"
    assert main(["train", "--resume", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 6
    capsys.readouterr()
    assert main(["eval", str(run), "--fewshot", "1,5", "--draws", "2", "--test-limit", "100", "--json", "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["data"] == "synthetic" and result["test_images"] == 100
    assert set(result["fewshot"]) == {"1", "5"} and 0 <= result["test_top1"] <= 1
    assert main(["eval", str(run), "--test-limit", "50", "--device", "cpu"]) == 0
    assert "top-1" in capsys.readouterr().out


def test_cli_errors_are_messages(tmp_path, capsys):
    assert main(["train", "vit_ti16", *TINY, "--data", "fashion-mnist", "--data-dir", str(tmp_path / "no"), "--steps", "2",
                 "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "vitzoo train: error: Fashion-MNIST not found" in err and not (tmp_path / "run").exists()
    for wrong in (["--patch-sise", "4"], ["--recipe", "paper-nonsense"], ["--img-size", "a,b"]):
        with pytest.raises(SystemExit):
            main(["train", "vit_ti16", *wrong])
    assert main(["eval", str(tmp_path)]) == 2
    assert "holds no saved model" in capsys.readouterr().err


def test_the_readmes_commands_parse_and_each_says_how_long_it_takes():
    """Every `vitzoo` line of the README's command-line block parses with today's flags (a train line also
    into a valid TrainConfig), and says how long it takes, on its line or in the comment line above it;
    the first training example is the small ViT, which takes minutes, not ViT-Ti."""
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
