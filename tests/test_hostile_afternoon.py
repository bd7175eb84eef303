"""Issue 33's silent guesses and misleading errors, each as a hostile user met it: nothing absurd is
computed, nothing is guessed silently, and every error blames what is at fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import ConfigError

TINY = dict(embed_dim=32, depth=1, num_heads=2, mlp_dim=64, img_size=28, patch_size=7)


def fit_tiny(out, **changes):
    from vitzoo.train import TrainConfig, fit

    base = dict(model="vit_ti16", model_options=dict(TINY), data="fashion-mnist", train_limit=64, test_limit=32,
                batch_size=32, steps=1, lr=1e-3, warmup=0, log_every=1, checkpoint_every=0, quiet=True,
                tensorboard=False, device="cpu", out=str(out))
    return fit(TrainConfig(**{**base, **changes}))


# ---------------------------------------------------------------------------- 2. more shots than a class holds
def test_more_shots_than_any_class_holds_is_refused_before_any_feature_is_computed():
    """`--fewshot 100000` had reported a "100000-shot" accuracy of 0.0000 spread: every draw was the
    whole training set. Refused, naming the largest and smallest class; k between them is said."""
    from vitzoo.evaluate import fewshot_draws, fewshot_linear_accuracy

    labels = torch.tensor([0] * 6 + [1] * 3)
    with pytest.raises(ConfigError, match=r"fewshot k=7: no class .* holds 7 images \(the largest holds 6, the smallest 3\)"):
        fewshot_draws(labels, (1, 7), draws=2, seed=0)
    with pytest.warns(UserWarning, match=r"fewshot k=5: 1 of 2 classes hold fewer than 5 .*smallest 3: class 1"):
        drawn = fewshot_draws(labels, (5,), draws=2, seed=0)
    assert [len(s) for s in drawn[5]] == [8, 8]  # 5 of class 0, all 3 of class 1

    class Images(torch.utils.data.Dataset):
        targets = labels

        def __len__(self):
            return len(labels)

        def __getitem__(self, i):
            raise AssertionError("a feature was computed before the refusal")

    model = vitzoo.create("vit_ti16", **TINY, num_classes=2)
    with pytest.raises(ConfigError, match="fewshot k=100000"):
        fewshot_linear_accuracy(model, Images(), Images(), shots=(100000,))


# ---------------------------------------------------------------------------- 8. info --img-size 0
@pytest.mark.parametrize("size", ["0", "-3"])
def test_info_refuses_a_resolution_of_zero_instead_of_showing_the_default(size, capsys):
    assert main(["info", "vit_b16", "--img-size", size]) == 2
    err = capsys.readouterr().err
    assert "img_size must be positive" in err


# ---------------------------------------------------------------------------- 13. named datasets' class names
def test_a_model_trained_on_a_named_dataset_keeps_its_class_names_and_predicts(tmp_path, capsys):
    """Fashion-MNIST's classes (torchvision's names) are saved with the run, so `vitzoo predict` names
    its predictions; it had refused "10 classes without names"."""
    from PIL import Image
    from torchvision.datasets import FashionMNIST

    fit_tiny(tmp_path / "run")
    assert json.loads((tmp_path / "run" / "config.json").read_text())["labels"] == list(FashionMNIST.classes)
    Image.fromarray((torch.rand(28, 28) * 255).to(torch.uint8).numpy()).save(tmp_path / "shirt.png")
    assert main(["predict", str(tmp_path / "shirt.png"), "--model", str(tmp_path / "run"), "--top", "3", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["predictions"][0]["top"]
    assert len(top) == 3 and {item["label"] for item in top} <= set(FashionMNIST.classes)


def test_a_run_on_some_classes_keeps_their_names_in_the_order_given(tmp_path):
    from torchvision.datasets import FashionMNIST

    fit_tiny(tmp_path / "run", classes=(9, 0, 5))
    assert vitzoo.from_pretrained(tmp_path / "run").labels == [FashionMNIST.classes[c] for c in (9, 0, 5)]


# ---------------------------------------------------------------------------- 12. errors that blame the wrong thing
@pytest.mark.parametrize("where", ["a file", "/sys"])
def test_a_download_into_a_folder_it_cannot_write_blames_the_folder_not_the_network(tmp_path, where, monkeypatch):
    from vitzoo.data import named
    from vitzoo.errors import DataError

    monkeypatch.setattr(named, "torchvision_class", lambda name: pytest.fail("a download was tried"))
    target = tmp_path / "afile" if where == "a file" else Path("/sys/vitzoo-datasets")
    if where == "a file":
        target.write_text("not a folder")
    with pytest.raises(DataError, match=r"cannot download cifar10 into .*(a file, not a folder|cannot be created|cannot write)") as info:
        named.download("cifar10", target)
    assert "network" not in str(info.value)


def test_a_download_that_fills_the_disk_blames_the_disk(tmp_path, monkeypatch):
    import errno

    from vitzoo.data import named
    from vitzoo.errors import DataError

    from torchvision.datasets import CIFAR10

    class Full(CIFAR10):  # torchvision's class, whose download meets a full disk
        def __init__(self, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(named, "torchvision_class", lambda name: Full)
    with pytest.raises(DataError, match="the folder or its disk is at fault, not the network: free some space"):
        named.download("cifar10", tmp_path)


def test_predict_names_a_directory_as_a_directory(tmp_path, capsys):
    assert main(["predict", str(tmp_path), "--model", "vit_ti16.augreg_in21k_ft_in1k"]) == 2
    assert "it is a directory, not an image file" in capsys.readouterr().err


def test_a_torch_save_file_named_safetensors_is_said_to_be_one(tmp_path):
    model = vitzoo.create("vit_ti16", **TINY, num_classes=3)
    for zipped in (True, False):
        path = tmp_path / f"weights{zipped}.safetensors"
        torch.save(model.state_dict(), path, _use_new_zipfile_serialization=zipped)
        with pytest.raises(vitzoo.CheckpointError, match="is not a safetensors file: its bytes are a (zip archive of pickles|pickle)"):
            vitzoo.from_pretrained(path)
        path.rename(path.with_suffix(".pth"))  # as the error says: then it reads
        assert vitzoo.from_pretrained(path.with_suffix(".pth"), num_heads=2).config.embed_dim == 32
    (tmp_path / "cut.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"")
    with pytest.raises(vitzoo.CheckpointError, match="damaged or truncated"):
        vitzoo.from_pretrained(tmp_path / "cut.safetensors")


def test_a_write_that_cannot_start_names_the_destination_not_a_temporary_file(tmp_path, capsys):
    from vitzoo.io import write_text

    vitzoo.create("vit_ti16", **TINY, num_classes=3).save_pretrained(tmp_path / "saved")
    assert main(["convert", str(tmp_path / "saved"), "/proc/vitzoo-convert"]) == 2
    err = capsys.readouterr().err
    assert "/proc/vitzoo-convert" in err and ".tmp" not in err
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError) as info:
        write_text(tmp_path / "file" / "x.json", "{}")
    assert str(tmp_path / "file" / "x.json") in str(info.value) and ".tmp" not in str(info.value)


def test_push_to_a_bad_repo_says_what_push_takes(tmp_path, capsys):
    vitzoo.create("vit_ti16", **TINY, num_classes=3).save_pretrained(tmp_path / "saved")
    assert main(["push", str(tmp_path / "saved"), "../evil"]) == 2
    err = capsys.readouterr().err
    assert "write ORG/NAME" in err and "hf-hub:" not in err


def test_an_unknown_component_in_a_saved_config_names_config_json(tmp_path):
    vitzoo.create("vit_ti16", **TINY, num_classes=3).save_pretrained(tmp_path / "saved")
    document = json.loads((tmp_path / "saved" / "config.json").read_text())
    document["model"]["stem"] = "bogus_stem"
    (tmp_path / "saved" / "config.json").write_text(json.dumps(document))
    with pytest.raises(ConfigError, match=r"saved/config.json: unknown stem 'bogus_stem'"):
        vitzoo.from_pretrained(tmp_path / "saved")


# ---------------------------------------------------------------------------- 12. environment variables
def read_autoload():
    from vitzoo import registry

    calls = []
    original = registry.Registry._load_entry_points
    registry.Registry._load_entry_points = lambda self: calls.append(1)
    try:
        registry.Registry()
    finally:
        registry.Registry._load_entry_points = original
    return bool(calls)


def read_cache():
    from vitzoo.io import cache_dir

    return cache_dir()


def read_slurm(name):
    from benchmarks.launchers import jobs

    return jobs.poll_s() if name == "VITZOO_SLURM_POLL_S" else jobs.unknown_live_s()


# every VITZOO_ variable the source reads: a value that means nothing, how it is read, what a good one gives
ENVIRONMENT = {
    "VITZOO_DISABLE_PLUGIN_AUTOLOAD": ("maybe", read_autoload, ("0", lambda value: value is True)),
    "VITZOO_CACHE": ("  ", read_cache, ("", lambda value: value == Path.home() / ".cache" / "vitzoo")),
    "VITZOO_SLURM_POLL_S": ("-1", lambda: read_slurm("VITZOO_SLURM_POLL_S"), ("0.5", lambda value: value == 0.5)),
    "VITZOO_SLURM_UNKNOWN_S": ("nan", lambda: read_slurm("VITZOO_SLURM_UNKNOWN_S"), ("7", lambda value: value == 7)),
}


@pytest.mark.parametrize("name", sorted(ENVIRONMENT))
def test_an_environment_variable_that_means_nothing_is_refused_naming_it(name, monkeypatch):
    """A value that means nothing raises an error that names the variable; a good one reads as meant."""
    bad, read, (good, holds) = ENVIRONMENT[name]
    monkeypatch.setenv(name, bad)
    with pytest.raises((ValueError, RuntimeError), match=rf"{name}={bad!r}"):
        read()
    monkeypatch.setenv(name, good)
    assert holds(read())


def test_every_environment_variable_of_the_source_is_tried_above():
    import re

    root = Path(__file__).resolve().parents[1]
    read = set()
    for path in [*root.glob("vitzoo/**/*.py"), *root.glob("benchmarks/**/*.py")]:
        source = path.read_text(encoding="utf-8")
        read |= set(re.findall(r"""environ(?:\.get\(|\[)\s*["'](VITZOO_[A-Z_]+)""", source))
        read |= set(re.findall(r"""env_\w+\(\s*["'](VITZOO_[A-Z_]+)""", source))
        read |= {m for m in re.findall(r"""^[A-Z_]+ = ["'](VITZOO_[A-Z_]+)["']""", source, re.M)}
    assert read - {"VITZOO_COMMIT"} <= set(ENVIRONMENT), read - set(ENVIRONMENT)  # VITZOO_COMMIT: any text is a commit
    assert {"VITZOO_CACHE", "VITZOO_DISABLE_PLUGIN_AUTOLOAD"} <= read  # the scan finds what is read
