"""The transfer benchmark (benchmarks/ablations/transfer.py): its cells and keys at each scale, the class
split, a tiny run end to end, Table 5 beside the paper's cells, the paper scale's plan, and the
rehearsal's fine-tuning from weights on the loopback Hub (in one process: cheap, and the code path of
each of the rehearsal's two)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hub_testing import hermetic_hub_environment  # tests/hub_testing.py

import vitzoo
from benchmarks.__main__ import main
from benchmarks.ablations import ABLATIONS, data_size, transfer
from benchmarks.scales import SCALES, get_scale
from benchmarks.transfer_runs import measure, publish_rehearsal_weights
from vitzoo.data import TensorImages, keep_classes
from vitzoo.errors import ConfigError, DataError
from hubserver import HubServer
from vitzoo.train import TrainConfig

SPEC = ABLATIONS["transfer"]


def test_cpu_cells_are_the_data_ablations_on_half_the_classes():
    runs = SPEC.runs(SCALES["cpu"])
    assert len(runs) == 3 * 3 * 3  # families x sizes x seeds
    sizes = sorted({r.group["images"] for r in runs})
    assert sizes == [n // 2 for n in data_size.SUBSETS["cpu"]] == [500, 3_750, 27_500]
    for run in runs:
        up, down = run.config["train"], run.config["transfer"]
        assert tuple(up["classes"]) == (0, 1, 2, 3, 4) and tuple(down["classes"]) == (5, 6, 7, 8, 9)
        assert tuple(down["finetune"]["classes"]) == (5, 6, 7, 8, 9) and down["finetune"]["recipe"] == "paper-finetune"
        # half the data ablation's 5,000 and its steps: 1,718 for the ViT and hybrid, 858 for the ResNet (the ViT's compute)
        assert up["val_size"] == 2_500 and up["steps"] == (429 if run.group["family"] == "ResNet" else 859)
        assert up["train_limit"] + up["val_size"] <= 30_000  # the 30,000 training images of classes 0-4
    assert len({r.key for r in runs}) == len(runs)
    # the key hashes the downstream measurement too
    run = runs[0]
    changed = dataclasses.replace(run, config={**run.config, "transfer": {**run.config["transfer"], "shots": 10}})
    assert changed.key != run.key


def test_upstream_never_sees_the_downstream_classes():
    images = torch.zeros(100, 1, 4, 4, dtype=torch.uint8)
    targets = torch.arange(100) % 10
    images[:, 0, 0, 0] = targets.to(torch.uint8)  # each image carries its original class
    dataset = TensorImages(images, targets)
    up, down = keep_classes(dataset, (0, 1, 2, 3, 4), "toy"), keep_classes(dataset, (5, 6, 7, 8, 9), "toy")
    assert len(up) == len(down) == 50
    assert {int(up[i][0][0, 0, 0]) for i in range(len(up))} == {0, 1, 2, 3, 4}
    assert {int(down[i][0][0, 0, 0]) for i in range(len(down))} == {5, 6, 7, 8, 9}
    assert all(down[i][1] == int(down[i][0][0, 0, 0]) - 5 for i in range(len(down)))  # relabelled 0-4
    assert down.targets.tolist() == [down[i][1] for i in range(len(down))]
    with pytest.raises(DataError, match="not 12"):
        keep_classes(dataset, (3, 12), "toy")
    with pytest.raises(ConfigError, match="once"):
        TrainConfig(classes=(1, 1))


def test_paper_cells_carry_the_recipe_and_table_5():
    runs = SPEC.runs(get_scale("paper", "/data/imagenet"))
    labels = {r.label for r in runs}
    assert {"vit_b16.orig_in21k cifar10", "vit_l16.orig_in21k imagenet", "vit_h14.orig_in21k flowers102"} <= labels
    assert len(runs) == len(transfer.MODELS) * len(transfer.DATASETS) * 3
    for run in runs:
        train, dataset = run.config["train"], run.group["dataset"]
        assert train["pretrained"] == run.group["tag"] and train["recipe"] == "paper-finetune"
        assert train["batch_size"] == 512 and train["steps"] == transfer.STEPS[dataset]
        assert run.config["options"]["img_size"] in (384, 378)  # H/14: 27 x 27 patches of 14
        assert len(run.config["more_train"]) == len(run.config["sweep"]["lrs"]) == 4
    by_label = {r.label: r for r in runs}
    assert by_label["vit_b16.orig_in21k imagenet"].config["sweep"]["lrs"] == [0.003, 0.01, 0.03, 0.06]
    assert by_label["vit_b16.orig_in21k oxford-pets"].config["sweep"]["dev"] == 368  # 10% of 3,680
    assert transfer.PAPER["vit_b16.orig_in21k cifar10"] == 0.9895
    # ImageNet's numbers are the ones the zoo gives the released ImageNet fine-tunes
    for model in ("vit_b16", "vit_l16"):
        tag = vitzoo.get_registry().get("pretrained_tag", f"{model}.orig_in21k_ft_in1k")
        assert transfer.PAPER[f"{model}.orig_in21k imagenet"] == pytest.approx(tag.accuracy / 100)


@pytest.mark.slow
def test_paper_dry_run_plans_every_fine_tuning(capsys):
    assert main(["transfer", "--scale", "paper", "--device", "cuda", "--dry-run"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| transfer |"))
    assert row.split("|")[2].strip() == str(len(transfer.MODELS) * len(transfer.DATASETS) * 3)
    assert float(row.split("|")[4]) > 1e20  # five fine-tunings per run, of ViT-B to ViT-H at 384 px


@pytest.mark.slow
def test_quick_run_end_to_end(tmp_path):
    assert main(["transfer", "--quick", "--quiet", "--out", str(tmp_path)]) == 0
    records = json.loads((tmp_path / "transfer" / "results.json").read_text())["runs"]
    assert len(records) == len(SPEC.runs(SCALES["quick"]))
    for r in records:
        for metric in ("test_acc", "transfer_fewshot_5", "transfer_finetune"):
            assert 0.0 <= r["metrics"][metric] <= 1.0
        assert r["flops"] > r["upstream_flops"] > 0
    findings = json.loads((tmp_path / "transfer" / "findings.json").read_text())["findings"]
    assert {f["metric"] for f in findings} == {"transfer_fewshot_5", "transfer_finetune"}
    assert {f["claim"] for f in findings} >= {"From little pre-training data ViT transfers worse than the ResNet",
                                               "The ResNet's lead over the ViT shrinks as the data grows"}
    readme = (tmp_path / "transfer" / "README.md").read_text()
    assert "downstream fine-tuned" in readme and "pre-training images" in readme


@pytest.mark.slow
def test_rehearsal_fine_tunes_weights_from_the_loopback_hub(tmp_path, monkeypatch):
    hermetic_hub_environment(monkeypatch, tmp_path)
    scale = get_scale("rehearsal", str(tmp_path / "data" / "imagenet"))
    run = next(r for r in SPEC.runs(scale) if r.label == "vit_l16.orig_in21k oxford-pets")
    assert run.config["train"]["pretrained"] == "hf-hub:rehearsal/vit_l16.orig_in21k"
    run = dataclasses.replace(run, config={**run.config, "sweep": {**run.config["sweep"], "lrs": [0.003, 0.03]},
                                           "train": {**run.config["train"], "micro_batch": None, "num_workers": 0}})
    transfer.write_rehearsal_data(scale)
    with HubServer(tmp_path / "hub") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        publish_rehearsal_weights(["vit_l16.orig_in21k"], server.url)
        outcome = measure(run, device="cpu", out=tmp_path / "run")
    assert outcome["metrics"]["lr"] in (0.003, 0.03)
    assert set(outcome["metrics"]["development"]) == {"0.003", "0.03"}
    assert 0.0 <= outcome["metrics"]["test_acc"] <= 1.0
    # fine-tuned at 384 px shrunk from weights pre-trained at 224 px shrunk: the position embedding resampled
    assert outcome["model_config"]["img_size"] == [56, 56] or tuple(outcome["model_config"]["img_size"]) == (56, 56)
    assert (tmp_path / "run" / "final" / "train" / "summary.json").exists()
