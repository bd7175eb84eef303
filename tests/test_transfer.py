"""The transfer benchmark (benchmarks/ablations/transfer.py): its cells at each scale, the class
split, Table 5 beside the paper's cells, and the rehearsal's sweep and fine-tuning of weights
downloaded from a loopback Hub. Its quick run is in tests/test_benchmarks.py's suite."""

import dataclasses

import pytest
import torch
from hub_testing import hermetic_hub_environment
from hubserver import HubServer

import vitzoo
from benchmarks.ablations import ABLATIONS, data_size, transfer
from benchmarks.scales import SCALES, get_scale
from benchmarks.transfer_runs import measure, publish_rehearsal_weights
from vitzoo.data import TensorImages, keep_classes
from vitzoo.errors import ConfigError, DataError
from vitzoo.train import TrainConfig

SPEC = ABLATIONS["transfer"]


def test_cpu_cells_are_the_data_ablations_on_half_the_classes():
    runs = SPEC.runs(SCALES["cpu"])
    assert len(runs) == len({r.key for r in runs}) == 3 * 3 * 3  # families x sizes x seeds
    assert sorted({r.group["images"] for r in runs}) == [n // 2 for n in data_size.SUBSETS["cpu"]]
    for run in runs:
        up, down = run.config["train"], run.config["transfer"]
        assert tuple(up["classes"]) == (0, 1, 2, 3, 4) and tuple(down["classes"]) == (5, 6, 7, 8, 9)
        assert tuple(down["finetune"]["classes"]) == (5, 6, 7, 8, 9)
        # the ResNet at the ViT's compute: half its steps
        assert up["steps"] == (429 if run.group["family"] == "ResNet" else 859)
        assert up["train_limit"] + up["val_size"] <= 30_000  # the images of classes 0-4
    run = runs[0]  # the key hashes the downstream measurement too
    changed = {**run.config, "transfer": {**run.config["transfer"], "shots": 10}}
    assert dataclasses.replace(run, config=changed).key != run.key


def test_upstream_never_sees_the_downstream_classes():
    images = torch.zeros(100, 1, 4, 4, dtype=torch.uint8)
    targets = torch.arange(100) % 10
    images[:, 0, 0, 0] = targets.to(torch.uint8)  # each image carries its class
    dataset = TensorImages(images, targets)
    up, down = (keep_classes(dataset, tuple(range(k, k + 5)), "toy") for k in (0, 5))
    assert len(up) == len(down) == 50
    assert {int(up[i][0][0, 0, 0]) for i in range(len(up))} == {0, 1, 2, 3, 4}
    assert all(down[i][1] == int(down[i][0][0, 0, 0]) - 5 for i in range(len(down)))  # relabelled
    assert down.targets.tolist() == [down[i][1] for i in range(len(down))]
    with pytest.raises(DataError, match="not 12"):
        keep_classes(dataset, (3, 12), "toy")
    with pytest.raises(ConfigError, match="once"):
        TrainConfig(classes=(1, 1))


def test_paper_cells_carry_the_recipe_and_table_5():
    runs = SPEC.runs(get_scale("paper", "/data/imagenet"))
    assert len(runs) == len(transfer.MODELS) * len(transfer.DATASETS) * 3
    for run in runs:
        train = run.config["train"]
        assert train["pretrained"] == run.group["tag"] and train["recipe"] == "paper-finetune"
        steps = transfer.TABLE_5[run.group["dataset"]][0]
        assert train["batch_size"] == 512 and train["steps"] == steps
        assert run.config["options"]["img_size"] in (384, 378)  # H/14: 27 x 27 patches of 14
        assert len(run.config["more_train"]) == len(run.config["sweep"]["lrs"]) == 4
    by_label = {r.label: r for r in runs}
    assert by_label["vit_b16.orig_in21k imagenet"].config["sweep"]["lrs"] == [3e-3, .01, .03, .06]
    assert by_label["vit_b16.orig_in21k oxford-pets"].config["sweep"]["dev"] == 368  # 10% of 3,680
    assert transfer.PAPER["vit_b16.orig_in21k cifar10"] == 0.9895
    for model in ("vit_b16", "vit_l16"):  # ImageNet's: the zoo's released fine-tunes'
        tag = vitzoo.get_registry().get("pretrained_tag", f"{model}.orig_in21k_ft_in1k")
        assert transfer.PAPER[f"{model}.orig_in21k imagenet"] == pytest.approx(tag.accuracy / 100)


@pytest.mark.slow
def test_the_rehearsal_sweeps_and_fine_tunes_weights_from_the_loopback_hub(tmp_path, monkeypatch):
    hermetic_hub_environment(monkeypatch, tmp_path)
    scale = get_scale("rehearsal", str(tmp_path / "data" / "imagenet"))
    run = next(r for r in SPEC.runs(scale) if r.label == "vit_l16.orig_in21k oxford-pets")
    assert run.config["train"]["pretrained"] == "hf-hub:rehearsal/vit_l16.orig_in21k"
    train = {**run.config["train"], "micro_batch": None, "num_workers": 0}  # one process here
    run = dataclasses.replace(run, config={**run.config, "train": train})
    transfer.write_rehearsal_data(scale)
    with HubServer(tmp_path / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        publish_rehearsal_weights(["vit_l16.orig_in21k"], server.url)
        outcome = measure(run, device="cpu", out=tmp_path / "run")
    lrs = run.config["sweep"]["lrs"]
    assert outcome["metrics"]["lr"] in lrs and set(outcome["metrics"]["development"]) == {
        f"{lr:g}" for lr in lrs}
    # fine-tuned at 384 px shrunk from weights of 224 px shrunk: the position embedding resampled
    assert list(outcome["model_config"]["img_size"]) == [56, 56]
    assert (tmp_path / "run" / "final" / "train" / "summary.json").exists()
