"""The input pipeline measured and planned with: `python -m benchmarks loader`, the plan's loader
bound and start-up (benchmarks/plan_inputs.py), and gpu-check's loader step on the CPU."""

import json
from pathlib import Path

import pytest
import torch

from benchmarks import loader, plan, plan_inputs
from benchmarks.ablations import ABLATIONS
from benchmarks.assignment import Assignment
from benchmarks.loader import PhotoSpec, mean_file_bytes, photo_folder
from benchmarks.scales import SCALES, get_scale

# a machine made up for the plan's arithmetic: one worker decodes 1,000 ImageNet images a second
# at 128 px, 500 at 224 (time per image linear in pixels); 100,000 files listed a second
RATES = {"gpu": (128, 1000.0), "paper": (224, 500.0), "rehearsal": (32, 4000.0)}
RECORD = {
    "environment": {"cpu": "a CPU", "date": "2026-11-26 12:00 UTC"},
    "pipelines": [{"scale": scale, "img_size": side, "images_per_s": {
        "torchvision.io": rate, "pil": rate / 2, "evaluation": rate * 2}}
        for scale, (side, rate) in RATES.items()],
    "listing": {"files_per_s": 100_000.0},
    "worker_start": {"fork_server_first_loader_s": 5.0, **{how: {
        "fixed_s": 0.01, "per_worker_s": each, "per_worker_per_million_files_s": pickled}
        for how, each, pickled in (("fork", 0.05, 0.0), ("forkserver", 0.1, 1.0))}},
}


@pytest.fixture
def recorded(monkeypatch):
    monkeypatch.setattr(plan_inputs, "recorded_loader", lambda path=None: RECORD)
    return RECORD


NODE = Assignment("local", "cuda", "stated", 8, (tuple(range(8)),), 1, present=False)  # stated


# ---------------------------------------------------------------------------- the plan
def test_a_worker_s_rate_is_the_recorded_one_or_between_the_recorded_sizes(recorded):
    assert plan_inputs.worker_rate(RECORD, "imagenet-like", 224, "torchvision.io") == 500.0
    between = plan_inputs.worker_rate(RECORD, "imagenet-like", 176, "torchvision.io")
    share = (176**2 - 128**2) / (224**2 - 128**2)
    assert 500 < between < 1000 and 1 / between == pytest.approx(1 / 1000 + share / 1000)
    assert plan_inputs.worker_rate(RECORD, "imagenet-like", 384, "torchvision.io") < 500  # slower
    assert plan_inputs.worker_rate(RECORD, "rehearsal", 56, "torchvision.io") == 4000.0  # one size


def test_a_run_of_image_files_trains_at_the_lower_of_the_gpus_and_its_loaders_rate(recorded):
    """ViT-B/16 at 128 px: 125 TFLOP/s a GPU is ~3,700 images/s, under the 8,000 of 8 workers of
    1,000: GPU-bound; at 500 TFLOP/s loader-bound, the loader's time what the run takes."""
    runs = ABLATIONS["head"].runs(get_scale("gpu", "imagenet"))
    run = next(r for r in runs if r.config["model"] == "vit_b16")
    assert 3500 < 125e12 / plan.image_flops(plan._model_key(run)) < 3900
    assert plan.run_time(run, NODE, 125.0).bound == "GPU"
    fast = plan.run_time(run, NODE, 500.0)
    images = plan.run_cost(run).train_images
    assert fast.bound == "loader" and fast.seconds - fast.startup_s >= images / (1000.0 * 8 * 8)


def test_the_cpu_scales_plan_as_before_a_fixed_start_and_no_loader(recorded, monkeypatch):
    """Fashion-MNIST is held as tensors: no loader bound, no listing; a start of the stated 4 s."""
    run = ABLATIONS["pos_embed"].runs(SCALES["cpu"])[0]
    cpu = Assignment("local", "cpu", "a CPU", 1, ((),), 1)
    key = plan._model_key(run)
    timed, cost = plan.run_time(run, cpu, 0.0, recorded={key: 100.0}), plan.run_cost(run)
    assert timed.bound == "CPU" and timed.startup_s == plan_inputs.BUILD_S == 4.0
    images = cost.train_images + plan.FORWARD_SHARE * cost.eval_images
    assert timed.seconds == pytest.approx(4.0 + images / 100.0)
    monkeypatch.setattr(plan_inputs, "recorded_loader",
                        lambda path=None: pytest.fail("a run of tensors read the loader record"))
    plan.run_time(run, cpu, 0.0, recorded={key: 100.0})


def test_a_run_s_start_grows_with_its_dataset_and_its_evaluations(recorded, tmp_path):
    """Listing 1.33 M files at 100,000 a second: 13 s; on 8 GPUs (Python < 3.12) each evaluation's
    8 workers start from a fork server with the 1.28 M paths pickled: 8 x 1.38 s."""
    train = dict(SCALES["gpu"].train, data="imagenet", eval_every=100, val_size=50_000)
    one = plan_inputs.startup_seconds(train, 128, processes=1, evaluations=0)
    assert one > (1_281_167 + 50_000) / 100_000
    many = plan_inputs.startup_seconds(train, 128, processes=8, evaluations=10)
    passes = plan_inputs.evaluation_passes(train, 10)
    assert len(passes) == 10 + 1 + 3 and passes[0] == 1_281_167  # validation: of the training split
    if plan_inputs.sys.version_info < (3, 12):
        assert many > one + 10 * 8 * (0.1 + 1.28)
    absent = dict(train, data=str(tmp_path / "absent"))  # no folder, no named dataset: ImageNet
    assert plan_inputs.startup_seconds(absent, 128, 1, 0) == pytest.approx(one)
    here = dict(train, data=str(tmp_path))  # an (empty) folder here
    assert plan_inputs.startup_seconds(here, 128, 1, 0) < one / 5
    assert plan_inputs.startup_seconds(dict(train, data="fashion-mnist"), 128, 8, 10) == 0.0


def test_the_plan_says_which_bound_each_ablation_meets_and_when_it_is_over_budget(recorded):
    scale = get_scale("gpu", "imagenet")
    plans = [plan.plan_ablation(ABLATIONS[name], scale, set(), NODE, 500.0)
             for name in ("head", "cost")]
    assert plans[0].bound == "loader" and plans[1].bound == ""  # cost times, it does not train
    text = plan.describe(plans, scale, NODE, 500.0)
    header = next(line for line in text.splitlines() if line.startswith("| ablation"))
    assert header.endswith("| bound |") and "| head |" in text
    assert "recorded rate of one worker" in text
    over = dict(plans[0].__dict__, minutes=30 * 60.0)
    text = plan.describe([plan.AblationPlan(**over)], scale, NODE, 500.0)
    assert "**Over budget: 30.0 h planned, the scale's budget is 24 h" in text


# ---------------------------------------------------------------------------- the benchmark
@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return photo_folder(tmp_path_factory.mktemp("photos"), PhotoSpec(6, 2, width=120, height=90))


def test_the_drawn_jpegs_are_photo_sized_for_their_pixels(photos):
    """A full-size image comes out near ImageNet's ~110 KB (the benchmark records the mean)."""
    from PIL import Image

    assert len(list(photos.glob("train/*/*.JPEG"))) == 6 and mean_file_bytes(photos) > 2000
    big = next(photo_folder(photos.parent / "one", PhotoSpec(1, 1)).glob("train/*/*.JPEG"))
    with Image.open(big) as image:
        assert image.size == (500, 375) and image.format == "JPEG"
    assert 70_000 < big.stat().st_size < 160_000


def test_gpu_check_s_loader_step_times_the_device_and_the_worker_path_on_any_device(photos):
    rates = loader.device_rates(photos, torch.device("cpu"), 1, 3, passes=2, sides=(32,))
    assert set(rates["32px"]) == {"device_decode", "device_path", "worker_path",
                                  "worker_path_per_worker"} and min(rates["32px"].values()) > 0


def fields(value):
    """A record's keys, nested (a list by its first item)."""
    if isinstance(value, dict):
        return {k: fields(v) for k, v in value.items()}
    return [fields(value[0])] if isinstance(value, list) and value else None


@pytest.mark.slow
def test_the_loader_benchmark_writes_the_record_the_plan_reads_and_its_table(tmp_path):
    """`--quick`: a few files, one pass; a record with the committed one's fields."""
    record = loader.main(out=tmp_path / "out", work=tmp_path / "work", quick=True)
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    assert fields(written) == fields(json.loads((loader.OUT / "results.json").read_text()))
    assert [(p["scale"], p["img_size"]) for p in written["pipelines"]] == [
        ("gpu", 128), ("paper", 224), ("rehearsal", 32)]
    assert all(v > 0 for p in written["pipelines"] for v in p["images_per_s"].values())
    assert written["environment"]["threads"] == 1 and written["listing"]["files_per_s"] > 0
    paper = record["pipelines"][1]["images_per_s"]["torchvision.io"]
    assert plan_inputs.worker_rate(written, "imagenet-like", 224, "torchvision.io") == paper
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "| gpu | 128 | 64 |" in readme and "files/s" in readme and "load average" in readme
