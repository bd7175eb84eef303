"""A model trained on a user's folder of images keeps the folder's class names, and `vitzoo predict`
names its predictions with them: the commands as a user types them (their parser and code, run in this
process: a process each would only add torch's import)."""

import json

import pytest
import torch

import vitzoo
from vitzoo.cli import main


def write_folder(root, classes=("cat", "dog", "owl")):
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", 8), ("val", 2)):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = (torch.rand(32, 32, 3, generator=generator) * 60 + 80 * c).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return root


def test_a_model_trained_on_a_folder_predicts_with_the_folder_s_class_names(tmp_path, capsys):
    data = write_folder(tmp_path / "animals")
    trained = main(["train", "vit_ti16", "--data", str(data), "--recipe", "small", "--steps", "3", "--batch-size", "12",
                    "--img-size", "32", "--patch-size", "8", "--embed-dim", "32", "--depth", "1", "--num-heads", "2",
                    "--mlp-dim", "64", "--device", "cpu", "--out", str(tmp_path / "run"), "--quiet", "--no-tensorboard"])
    assert trained == 0, capsys.readouterr().err[-3000:]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["labels"] == ["cat", "dog", "owl"]
    assert vitzoo.from_pretrained(tmp_path / "run").labels == ["cat", "dog", "owl"]
    capsys.readouterr()
    predicted = main(["predict", str(data / "val" / "owl" / "0.png"), "--model", str(tmp_path / "run"), "--top", "3",
                      "--json"])
    printed = capsys.readouterr()
    assert predicted == 0, printed.err[-3000:]
    top = json.loads(printed.out)["predictions"][0]["top"]
    assert sorted(item["label"] for item in top) == ["cat", "dog", "owl"]
    assert abs(sum(item["probability"] for item in top) - 1) < 1e-5


def test_saved_class_names_must_be_names(tmp_path):
    model = vitzoo.create("vit_ti16", num_classes=2, img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, mlp_dim=64)
    model.labels = ["left", "right"]
    model.save_pretrained(tmp_path / "saved")
    assert vitzoo.from_pretrained(tmp_path / "saved").labels == ["left", "right"]
    document = json.loads((tmp_path / "saved" / "config.json").read_text())
    document["labels"] = [1, 2]
    (tmp_path / "saved" / "config.json").write_text(json.dumps(document))
    with pytest.raises(vitzoo.CheckpointError, match="list of class names"):
        vitzoo.from_pretrained(tmp_path / "saved")
