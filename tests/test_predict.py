"""`vitzoo predict` names its predictions with the class names the model was trained with: a
folder's, a named dataset's (in the order of the classes chosen); a head without class names is
refused from its tag before anything is downloaded. The commands run as a user types them, in this
process."""

from __future__ import annotations

import json

import torch

import vitzoo
from vitzoo.cli import main


TINY = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)


def fit_tiny(out, **changes):
    from vitzoo.train import TrainConfig, fit

    base = dict(model="vit_ti16", model_options=dict(TINY), data="fashion-mnist",
                train_limit=64, test_limit=32,
                batch_size=32, steps=1, lr=1e-3, warmup=0, log_every=1,
                checkpoint_every=0, quiet=True,
                tensorboard=False, device="cpu", out=str(out))
    return fit(TrainConfig(**{**base, **changes}))


def write_folder(root, classes=("cat", "dog", "owl")):
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for split, count in (("train", 8), ("val", 2)):
        for c, name in enumerate(classes):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = (torch.rand(32, 32, 3,
                                     generator=generator) * 60 + 80 * c).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return root


def test_a_model_trained_on_a_folder_predicts_with_the_folder_s_class_names(tmp_path, capsys):
    data = write_folder(tmp_path / "animals")
    trained = main(["train", "vit_ti16", "--data", str(data), "--recipe", "small", "--steps", "3",
                    "--batch-size", "12",
                    "--img-size", "32", "--patch-size", "8", "--embed-dim", "32", "--depth",
                    "1", "--num-heads", "2",
                    "--mlp-dim", "64", "--device", "cpu", "--out", str(tmp_path / "run"),
                    "--quiet", "--no-tensorboard"])
    assert trained == 0, capsys.readouterr().err[-3000:]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["labels"] == ["cat", "dog", "owl"]
    assert vitzoo.from_pretrained(tmp_path / "run").labels == ["cat", "dog", "owl"]
    capsys.readouterr()
    predicted = main(["predict", str(data / "val" / "owl" / "0.png"), "--model",
                      str(tmp_path / "run"), "--top", "3",
                      "--json"])
    printed = capsys.readouterr()
    assert predicted == 0, printed.err[-3000:]
    top = json.loads(printed.out)["predictions"][0]["top"]
    assert sorted(item["label"] for item in top) == ["cat", "dog", "owl"]
    assert abs(sum(item["probability"] for item in top) - 1) < 1e-5


def test_a_model_trained_on_a_named_dataset_keeps_its_class_names_and_predicts(tmp_path, capsys):
    """Fashion-MNIST's classes (torchvision's names) are saved with the run, so `vitzoo predict`
    names its predictions."""
    from PIL import Image
    from torchvision.datasets import FashionMNIST

    fit_tiny(tmp_path / "run")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["labels"] == list(FashionMNIST.classes)
    Image.fromarray((torch.rand(28, 28) * 255).to(torch.uint8).numpy()).save(tmp_path / "shirt.png")
    assert main(["predict", str(tmp_path / "shirt.png"), "--model", str(tmp_path / "run"), "--top",
                 "3", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["predictions"][0]["top"]
    assert len(top) == 3 and {item["label"] for item in top} <= set(FashionMNIST.classes)


def test_a_run_on_some_classes_keeps_their_names_in_the_order_given(tmp_path):
    from torchvision.datasets import FashionMNIST

    fit_tiny(tmp_path / "run", classes=(9, 0, 5))
    assert vitzoo.from_pretrained(tmp_path / "run").labels == [FashionMNIST.classes[c] for c in (9, 0, 5)]


def test_predict_refuses_a_head_without_class_names_before_downloading(
        hub_server, tmp_path, monkeypatch, capsys):
    """`vitzoo predict --model vit_ti16.augreg_in21k` refuses its 21,843 unnamed classes from the
    tag, before the repo (38 MB) is downloaded, as orig_in21k's missing head is."""
    from PIL import Image
    from huggingface_hub import HfApi

    from hub_testing import TOKEN
    from vitzoo.catalog import registered
    from vitzoo.weights import hub

    tag = registered()["vit_ti16.augreg_in21k"]
    api = HfApi(endpoint=hub_server.url, token=TOKEN)
    api.create_repo(tag.hub_id)
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224"}))
    api.upload_folder(folder_path=tmp_path / "repo", repo_id=tag.hub_id)
    downloads = []
    real = hub.download
    monkeypatch.setattr(hub, "download", lambda *a, **k: downloads.append(a) or real(*a, **k))
    Image.new("RGB", (32, 32)).save(tmp_path / "cat.png")
    assert main(["predict", str(tmp_path / "cat.png"), "--model", "vit_ti16.augreg_in21k"]) == 2
    # the cache too
    assert downloads == [] and not list((tmp_path / "hf_home" / "hub").glob("models--timm--*"))
    err = capsys.readouterr().err
    assert "vit_ti16.augreg_in21k has a head of 21843 classes without names" in err
    assert "vit_ti16.augreg_in21k_ft_in1k" in err  # a tag that names its classes
