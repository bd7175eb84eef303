"""The input pipeline measured and planned with: `python -m benchmarks loader` (benchmarks/loader.py),
the plan's loader bound and start-up (benchmarks/plan_inputs.py), and gpu-check's loader step, whose
code path is checked here on the CPU."""

import json
from pathlib import Path

import pytest
import torch

from benchmarks import loader, plan, plan_inputs
from benchmarks.ablations import ABLATIONS
from benchmarks.assignment import Assignment
from benchmarks.loader import PhotoSpec, mean_file_bytes, photo_folder
from benchmarks.scales import SCALES, get_scale

# a loader measurement of a machine made up for the plan's arithmetic: one worker decodes 1,000 ImageNet
# images a second at 128 px, 500 at 224 (time per image linear in pixels); 100,000 files listed a second
RECORD = {
    "environment": {"cpu": "a CPU", "date": "2026-11-26 12:00 UTC"},
    "pipelines": [{"scale": "gpu", "img_size": 128, "images_per_s": {"torchvision.io": 1000.0, "pil": 500.0, "evaluation": 2000.0}},
                  {"scale": "paper", "img_size": 224, "images_per_s": {"torchvision.io": 500.0, "pil": 250.0, "evaluation": 1000.0}},
                  {"scale": "rehearsal", "img_size": 32, "images_per_s": {"torchvision.io": 4000.0, "pil": 2000.0,
                                                                          "evaluation": 8000.0}}],
    "listing": {"files_per_s": 100_000.0},
    "worker_start": {"fork_server_first_loader_s": 5.0,
                     "fork": {"fixed_s": 0.01, "per_worker_s": 0.05, "per_worker_per_million_files_s": 0.0},
                     "forkserver": {"fixed_s": 0.01, "per_worker_s": 0.1, "per_worker_per_million_files_s": 1.0}},
}


@pytest.fixture
def recorded(monkeypatch):
    monkeypatch.setattr(plan_inputs, "recorded_loader", lambda path=None: RECORD)
    return RECORD


def _stated_node(gpus: int = 8) -> Assignment:
    return Assignment("local", "cuda", "stated", gpus, (tuple(range(gpus)),), 1, present=False)


# ---------------------------------------------------------------------------- the plan
def test_a_worker_s_rate_is_the_recorded_one_or_between_the_recorded_sizes(recorded):
    assert plan_inputs.worker_rate(RECORD, "imagenet-like", 224, "torchvision.io") == 500.0
    between = plan_inputs.worker_rate(RECORD, "imagenet-like", 176, "torchvision.io")
    assert 500 < between < 1000
    assert 1 / between == pytest.approx(1 / 1000 + (1 / 500 - 1 / 1000) * (176**2 - 128**2) / (224**2 - 128**2))
    assert plan_inputs.worker_rate(RECORD, "imagenet-like", 384, "torchvision.io") < 500  # beyond: slower still
    assert plan_inputs.worker_rate(RECORD, "rehearsal", 56, "torchvision.io") == 4000.0  # its only size


def test_a_run_of_image_files_trains_at_the_lower_of_the_gpus_and_its_loaders_rate(recorded):
    """ViT-B/16 at 128 px on a stated node: 125 TFLOP/s per GPU is about 3,700 images/s (34 GFLOPs an
    image, forward and backward, a multiply-add two FLOPs); 8 workers of 1,000 images/s feed 8,000:
    GPU-bound. At 500 TFLOP/s per GPU loader-bound, and the loader's time is what the run then takes."""
    run = next(r for r in ABLATIONS["head"].runs(get_scale("gpu", "imagenet")) if r.config["model"] == "vit_b16")
    node = _stated_node()
    gpu_rate = 125e12 / plan.image_flops(plan._model_key(run))
    assert 3500 < gpu_rate < 3900
    assert plan.run_time(run, node, 125.0).bound == "GPU"
    fast = plan.run_time(run, node, 500.0)
    assert fast.bound == "loader"
    images = plan.run_cost(run).train_images
    assert fast.seconds - fast.startup_s >= images / (1000.0 * 8 * 8)


def test_the_cpu_scales_plan_as_before_a_fixed_start_and_no_loader(recorded, monkeypatch):
    """Fashion-MNIST is held as tensors: no loader bound, no listing; the start is the stated 4 s."""
    run = ABLATIONS["pos_embed"].runs(SCALES["cpu"])[0]
    cpu = Assignment("local", "cpu", "a CPU", 1, ((),), 1)
    key = plan._model_key(run)
    timed = plan.run_time(run, cpu, 0.0, recorded={key: 100.0})
    cost = plan.run_cost(run)
    assert timed.bound == "CPU" and timed.startup_s == plan_inputs.BUILD_S == 4.0
    assert timed.seconds == pytest.approx(4.0 + (cost.train_images + plan.FORWARD_SHARE * cost.eval_images) / 100.0)
    monkeypatch.setattr(plan_inputs, "recorded_loader", lambda path=None: pytest.fail("a run of tensors read the loader record"))
    plan.run_time(run, cpu, 0.0, recorded={key: 100.0})


def test_a_run_s_start_grows_with_its_dataset_and_its_evaluations(recorded, tmp_path):
    """Listing ImageNet's 1.33 M files at 100,000 a second: 13 s; on 8 GPUs (Python < 3.12) every
    evaluation pass's 8 workers start from a fork server and get the 1.28 M paths pickled: 8 x 1.38 s."""
    train = dict(SCALES["gpu"].train, data="imagenet", eval_every=100, val_size=50_000)
    one = plan_inputs.startup_seconds(train, 128, processes=1, evaluations=0)
    assert one > (1_281_167 + 50_000) / 100_000
    many = plan_inputs.startup_seconds(train, 128, processes=8, evaluations=10)
    passes = plan_inputs.evaluation_passes(train, 10)
    assert len(passes) == 10 + 1 + 3 and passes[0] == 1_281_167  # validation: a subset of the training split's files
    if plan_inputs.sys.version_info < (3, 12):
        assert many > one + 10 * 8 * (0.1 + 1.28)
    absent = dict(train, data=str(tmp_path / "absent"))  # not a folder here, nor a named dataset: ImageNet assumed
    assert plan_inputs.startup_seconds(absent, 128, 1, 0) == pytest.approx(one)
    assert plan_inputs.startup_seconds(dict(train, data=str(tmp_path)), 128, 1, 0) < one / 5  # an (empty) folder here
    assert plan_inputs.startup_seconds(dict(train, data="fashion-mnist"), 128, 8, 10) == 0.0


def test_the_plan_says_which_bound_each_ablation_meets_and_when_the_suite_is_over_its_budget(recorded):
    scale = get_scale("gpu", "imagenet")
    plans = [plan.plan_ablation(ABLATIONS[name], scale, set(), _stated_node(), 500.0) for name in ("head", "cost")]
    assert plans[0].bound == "loader" and plans[1].bound == ""  # cost times, it does not train
    text = plan.describe(plans, scale, _stated_node(), 500.0)
    header = next(line for line in text.splitlines() if line.startswith("| ablation"))
    assert header.endswith("| bound |") and "| head |" in text and "recorded rate of one worker" in text
    over = dict(plans[0].__dict__, minutes=30 * 60.0)
    text = plan.describe([plan.AblationPlan(**over)], scale, _stated_node(), 500.0)
    assert "**Over budget: 30.0 h planned, the scale's budget is 24 h" in text


# ---------------------------------------------------------------------------- the benchmark
@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return photo_folder(tmp_path_factory.mktemp("photos"), PhotoSpec(images=6, classes=2, width=120, height=90))


def test_the_written_jpegs_are_photo_sized_for_their_pixels(photos):
    """A full-size image comes out near ImageNet's ~110 KB (one, here: the benchmark records the mean)."""
    from PIL import Image

    assert len(list(photos.glob("train/*/*.JPEG"))) == 6 and mean_file_bytes(photos) > 2000
    big = photo_folder(photos.parent / "one", PhotoSpec(images=1, classes=1))
    file = next(big.glob("train/*/*.JPEG"))
    with Image.open(file) as image:
        assert image.size == (500, 375) and image.format == "JPEG"
    assert 70_000 < file.stat().st_size < 160_000


def test_gpu_check_s_loader_step_times_the_device_and_the_worker_path_on_any_device(photos):
    rates = loader.device_rates(photos, torch.device("cpu"), workers=1, micro_batch=3, passes=2,
                                sides=(32,))
    assert set(rates["32px"]) == {"device_decode", "device_path", "worker_path", "worker_path_per_worker"}
    assert all(v > 0 for v in rates["32px"].values())


@pytest.mark.slow
def test_the_loader_benchmark_writes_its_figures_and_table(tmp_path):
    """`--quick`: a few files, one pass; every figure the plan reads is there, and the README says it."""
    record = loader.main(out=tmp_path / "out", work=tmp_path / "work", quick=True)
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    assert written["pipelines"] == record["pipelines"] and [p["scale"] for p in record["pipelines"]] == ["gpu", "paper", "rehearsal"]
    assert [p["img_size"] for p in record["pipelines"]] == [128, 224, 32]
    for p in record["pipelines"]:
        assert set(p["images_per_s"]) == set(loader.PATHS) and all(v > 0 for v in p["images_per_s"].values())
    env = written["environment"]
    assert env["threads"] == 1 and env["cpu"] and len(env["load_average_before"]) == 3 and env["commit"]
    assert written["listing"]["files_per_s"] > 0 and written["worker_start"]["fork"]["per_worker_s"] is not None
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "| gpu | 128 | 64 |" in readme and "files/s" in readme and "load average" in readme
    rates = {p["scale"]: p for p in record["pipelines"]}
    assert plan_inputs.worker_rate(written, "imagenet-like", 224, "torchvision.io") == rates["paper"]["images_per_s"]["torchvision.io"]
    committed = json.loads((loader.OUT / "results.json").read_text())  # the format the plan reads
    assert fields(written) == fields(committed)


def fields(value):
    """A record's keys, nested (a list by its first item)."""
    if isinstance(value, dict):
        return {k: fields(v) for k, v in value.items()}
    return [fields(value[0])] if isinstance(value, list) and value else None
