"""`vitzoo predict` names its predictions with the class names the model was trained with (a
folder's; a named dataset's, in the order of the classes chosen); a head without class names is
refused. The commands run as a user types them."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

import vitzoo
from vitzoo.cli import main

TINY = ["--embed-dim", "32", "--depth", "1", "--num-heads", "2", "--mlp-dim", "64"]


def predicted(capsys, image, run, top: int = 3) -> list[dict]:
    assert main(["predict", str(image), "--model", str(run), "--top", str(top), "--json"]) == 0
    return json.loads(capsys.readouterr().out)["predictions"][0]["top"]


def test_a_model_trained_on_a_folder_predicts_with_its_class_names(tmp_path, capsys):
    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", 8), ("val", 2)):
        for c, name in enumerate(("cat", "dog", "owl")):
            (tmp_path / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = torch.rand(32, 32, 3, generator=generator) * 60 + 80 * c
                Image.fromarray(pixels.byte().numpy()).save(tmp_path / split / name / f"{i}.png")
    assert main(["train", "vit_ti16", "--data", str(tmp_path), "--recipe", "small", "--steps",
                 "3", "--batch-size", "12", "--img-size", "32", "--patch-size", "8", *TINY,
                 "--device", "cpu", "--out", str(tmp_path / "run"), "--quiet",
                 "--no-tensorboard"]) == 0, capsys.readouterr().err[-3000:]
    assert vitzoo.from_pretrained(tmp_path / "run").labels == ["cat", "dog", "owl"]
    capsys.readouterr()
    top = predicted(capsys, tmp_path / "val" / "owl" / "0.png", tmp_path / "run")
    assert sorted(item["label"] for item in top) == ["cat", "dog", "owl"]
    assert abs(sum(item["probability"] for item in top) - 1) < 1e-5


def test_a_run_on_some_classes_of_a_named_dataset_keeps_their_names_in_order(tmp_path, capsys):
    from torchvision.datasets import FashionMNIST

    from vitzoo.train import TrainConfig, fit

    fit(TrainConfig(model="vit_ti16", data="fashion-mnist", classes=(9, 0, 5), train_limit=64,
                    test_limit=32, batch_size=32, steps=1, warmup=0, checkpoint_every=0,
                    quiet=True, tensorboard=False, device="cpu", out=str(tmp_path / "run"),
                    model_options=dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64,
                                       img_size=28, patch_size=7)))
    names = [FashionMNIST.classes[c] for c in (9, 0, 5)]
    assert vitzoo.from_pretrained(tmp_path / "run").labels == names
    Image.fromarray((torch.rand(28, 28) * 255).byte().numpy()).save(tmp_path / "shirt.png")
    assert {item["label"] for item in predicted(capsys, tmp_path / "shirt.png",
                                                tmp_path / "run")} == set(names)


def test_a_head_without_class_names_is_refused(tmp_path, capsys, tiny):
    vitzoo.create("vit_ti16", **tiny).save_pretrained(tmp_path / "nameless")
    Image.new("RGB", (32, 32)).save(tmp_path / "cat.png")
    assert main(["predict", str(tmp_path / "cat.png"), "--model", str(tmp_path / "nameless")]) == 2
    assert "nameless has a head of 5 classes without names" in capsys.readouterr().err
    assert main(["predict", str(tmp_path), "--model", str(tmp_path / "nameless")]) == 2
    assert f"cannot read image {str(tmp_path)!r}" in capsys.readouterr().err


def test_a_top_below_one_is_refused_before_anything_loads(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["predict", "cat.png", "--model", "vit_ti16", "--top", "0"])
    assert exited.value.code == 2
    assert "argument --top: must be at least 1, got 0" in capsys.readouterr().err
