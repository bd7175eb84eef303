"""The paper scale's code path, rehearsed on the CPU (`--scale rehearsal`): runs as two-process
data-parallel jobs through PyTorch's elastic launcher on a JPEG folder in ImageNet's layout, with
micro-batches and checkpoints; and the paper scale's sizes, taken from its data."""

import contextlib
import io
import json

import pytest
import torch

import benchmarks.__main__ as bench
from benchmarks.ablations import ABLATIONS
from benchmarks.ablations.data_size import subsets
from benchmarks.rehearsal_data import FolderSpec
from benchmarks.scales import get_scale, rehearsal_model
from benchmarks.suite import NUMERICS_VERSION, record_folder
from benchmarks.training import evaluate_per_epoch, train_images

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def rehearse(out, *more: str) -> str:
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        assert bench.main(["inspect", "--scale", "rehearsal", "--seeds", "1", "--quiet",
                           "--out", str(out), *more]) == 0
    return said.getvalue()


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """`python -m benchmarks inspect --scale rehearsal --seeds 1`: its two runs."""
    out = tmp_path_factory.mktemp("rehearsal")
    return out, rehearse(out)


@pytest.mark.slow
def test_the_rehearsal_trains_each_run_as_a_two_process_job_on_a_jpeg_folder(rehearsal):
    out, said = rehearsal
    assert "1 run(s) at once, each 2 CPU process(es)" in said  # the plan's, the launcher's
    root, spec = out / "data" / "imagenet", FolderSpec()
    train, val = sorted((root / "train").iterdir()), sorted((root / "val").iterdir())
    assert [d.name for d in train] == [d.name for d in val] == [f"n{c:08d}" for c in range(10)]
    assert sum(len(list(d.glob("*.JPEG"))) for d in train) == spec.train_images
    assert all(f.name.startswith("ILSVRC2012_val_") for d in val for f in d.iterdir())
    records = json.loads((out / "inspect" / "results.json").read_text())["runs"]
    assert len(records) == 2 and {(r["processes"], r["world_size"]) for r in records} == {(2, 2)}
    for r in records:
        train = r["config"]["train"]
        assert train["data"] == str(root) and train["num_workers"] >= 1
        assert (train["batch_size"], train["micro_batch"]) == (16, 4)  # 2 processes x 2 x 4
        folder = record_folder(out / "inspect", r["key"], NUMERICS_VERSION)
        saved = json.loads((folder / "train" / "train_config.json").read_text())
        assert saved["checkpoint_every"] == 10
        assert (folder / "train" / "model.safetensors").is_file()
        assert not (folder / "train" / "checkpoints").exists()  # a finished run keeps its weights
        assert list((folder / "logs").rglob("stderr.log"))  # every rank's
    findings = json.loads((out / "inspect" / "findings.json").read_text())
    assert findings["scale"] == "rehearsal"
    assert {f["verdict"] for f in findings["findings"]} <= {"not testable", "not compared"}


def test_an_epoch_is_the_datasets():
    cifar = {"data": "cifar10", "batch_size": 512}
    assert train_images(cifar) == 50_000 and evaluate_per_epoch(cifar, 2)["eval_every"] == 48
    imagenet = {"data": "/no/such/imagenet", "batch_size": 4096}  # not here: ImageNet-1k assumed
    assert evaluate_per_epoch(imagenet)["eval_every"] == 1_281_167 // 4096


def test_the_data_ablation_holds_out_the_papers_share_of_any_dataset():
    assert subsets(get_scale("paper", "imagenet")) == ((10_000, 100_000, 1_000_000), 50_000)
    assert subsets(get_scale("paper", "cifar10")) == ((4096, 4096, 39_027), 1_951)
    for run in ABLATIONS["data"].runs(get_scale("paper", "cifar10")):
        assert run.config["train"]["val_size"] + run.config["train"]["train_limit"] <= 50_000


def test_the_rehearsal_shrinks_every_dimension_and_keeps_cells_apart():
    b16, l16 = rehearsal_model("vit_b16", {"img_size": 224}), rehearsal_model("vit_l16", {})
    assert (b16["embed_dim"], b16["depth"], b16["patch_size"], b16["img_size"]) == (24, 3, 4, 32)
    assert l16["embed_dim"] > b16["embed_dim"] and l16["depth"] > b16["depth"]
    hybrid = rehearsal_model("vit_b16_hybrid", {"img_size": 224})  # R50's 16 blocks: a quarter
    assert hybrid["stem_options"]["layers"] == (2, 2) and hybrid["img_size"] == 32
    scale = get_scale("rehearsal", "/data/imagenet")
    for spec in ABLATIONS.values():
        configs = [json.dumps(r.config, sort_keys=True) for r in spec.runs(scale) if r.seed == 0]
        assert len(set(configs)) == len(configs), spec.name


@CUDA
@pytest.mark.slow
def test_on_a_gpu_the_rehearsal_trains_each_run_on_its_gpu_set(tmp_path):
    rehearse(tmp_path, "--device", "cuda")
    records = json.loads((tmp_path / "inspect" / "results.json").read_text())["runs"]
    assert len(records) == 2 and all(r["device"] == "cuda" and r["gpus"] for r in records)
    assert {r["world_size"] for r in records} == {len(records[0]["gpus"])}
