"""The paper-scale code path, rehearsed on the CPU: every ablation of `--scale rehearsal` trains its runs
as two-process data-parallel jobs through PyTorch's elastic launcher on a JPEG ImageFolder in ImageNet's
layout, the plan describes the assignment the launcher uses, and the problems found by reading that
path (a fixed 60,000-image epoch, a validation split larger than CIFAR, a probe that ignored the run's
precision, runs in a temporary folder) stay fixed."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import plan as planning
from benchmarks.ablations import ABLATIONS
from benchmarks.assignment import Assignment, assign, batch_share, default_per_run
from benchmarks.rehearsal_data import FolderSpec, image_folder
from benchmarks.scales import get_scale, rehearsal_model
from benchmarks.suite import ResultStore, Run, run_folder
from benchmarks.training import evaluate_per_epoch, train_images

CHECKOUT = Path(__file__).resolve().parents[1]


def benchmarks(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(CHECKOUT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=CHECKOUT, env=env)


# ---------------------------------------------------------------------------- the whole rehearsal
@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """`python -m benchmarks all --scale rehearsal`, as a GPU user would first run it, on the CPU; one
    seed per cell, to keep the test suite's minutes (tests/test_cluster_launcher.py judges two-seed cells)."""
    out = tmp_path_factory.mktemp("rehearsal")
    result = benchmarks("all", "--scale", "rehearsal", "--seeds", "1", "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result.stdout


@pytest.mark.slow
def test_the_rehearsal_trains_every_ablation_as_two_process_jobs(rehearsal):
    out, printed = rehearsal
    scale = dataclasses.replace(get_scale("rehearsal", str(out / "data" / "imagenet")), seeds=1)
    for name, spec in ABLATIONS.items():
        runs = spec.runs(scale)
        records = {r["key"]: r for r in json.loads((out / name / "results.json").read_text())["runs"]}
        assert set(records) == {run.key for run in runs}, name  # every run of every cell
        assert len({run.key for run in runs}) == len(runs)  # shrinking kept every cell distinct
        findings = json.loads((out / name / "findings.json").read_text())
        assert findings["scale"] == "rehearsal" and (out / name / "README.md").is_file()
        if not spec.trains:
            continue
        assert {r["processes"] for r in records.values()} == {2}  # the launcher's processes ...
        assert {r["world_size"] for r in records.values()} == {2}  # ... are the ones that trained
        # every finding judged by the rule: with one seed a cell has no standard error, and the verdict says so
        verdicts = {f["verdict"] for f in findings["findings"]}
        if name == "transfer":  # at the paper's scales a table beside Table 5's numbers: no claim to judge
            assert not verdicts and "paper (Table 5" in (out / name / "README.md").read_text()
        else:
            assert verdicts and verdicts <= {"not testable", "not compared"} and "not testable" in verdicts, name
        for run in runs:  # each run trained in its own folder under the results, with its logs
            folder = run_folder(ResultStore(out / name), run)
            train = folder / "final" / "train" if name == "transfer" else folder / "train"  # transfer: after its sweep
            assert json.loads((train / "train_config.json").read_text())["checkpoint_every"] == 10
            # finished: its final weights stay, its checkpoints (written every 10 steps) are gone
            assert (train / "model.safetensors").is_file() and not (train / "checkpoints").exists()
            assert list((folder / "logs").rglob("stderr.log"))
    assert "1 run(s) at once, each 2 CPU process(es)" in printed  # the plan describes that assignment


@pytest.mark.slow
def test_the_rehearsal_data_is_a_jpeg_folder_in_imagenets_layout_decoded_by_loader_workers(rehearsal):
    out, _ = rehearsal
    root = out / "data" / "imagenet"
    spec = FolderSpec()
    train, val = sorted((root / "train").iterdir()), sorted((root / "val").iterdir())
    assert [d.name for d in train] == [d.name for d in val] == [f"n{c:08d}" for c in range(spec.classes)]
    assert sum(len(list(d.glob("*.JPEG"))) for d in train) == spec.train_images
    assert all(f.name.startswith("ILSVRC2012_val_") for d in val for f in d.iterdir())
    record = json.loads((out / "head" / "results.json").read_text())["runs"][0]
    assert record["config"]["train"]["num_workers"] >= 1 and record["config"]["train"]["data"] == str(root)
    # the paper's global batch, accumulated from micro-batches: 2 processes x 2 micro-batches x 4 images
    assert (record["config"]["train"]["batch_size"], record["config"]["train"]["micro_batch"]) == (16, 4)


@pytest.mark.slow
def test_a_second_invocation_measures_nothing_again(rehearsal):
    out, _ = rehearsal
    before = (out / "pos_embed" / "results.json").read_text()
    result = benchmarks("pos_embed", "--scale", "rehearsal", "--seeds", "1", "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| pos_embed | 8 | 0 |" in result.stdout  # the plan: 8 runs (one seed), none left to measure
    assert json.loads((out / "pos_embed" / "results.json").read_text()) == json.loads(before)


# ---------------------------------------------------------------------------- the assignment
def fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")


def test_gpus_are_cut_into_disjoint_sets_one_run_on_each(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_gpus(monkeypatch, 8)
    whole = assign("cuda")
    assert whole.slots == (tuple("01234567"),) and whole.processes_per_run == 8  # default: every GPU
    pairs = assign("cuda", gpus_per_run=2)
    assert pairs.slots == (("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")) and pairs.runs_at_once == 4
    odd = assign("cuda", gpus_per_run=3)
    assert odd.slots == (("0", "1", "2"), ("3", "4", "5")) and odd.idle_gpus == 2 and "2 GPU(s) idle" in odd.describe()
    with pytest.raises(ValueError, match="8 visible GPU"):
        assign("cuda", gpus_per_run=16)


def test_gpu_sets_name_the_gpus_the_parent_process_sees(monkeypatch):
    """Slots are positions in the visible list; a child must be given the ids the list holds (indices,
    UUIDs, MIG ids), or a suite started on GPUs 4-7 trains on 0-3."""
    fake_gpus(monkeypatch, 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert assign("cuda", gpus_per_run=2).slots == (("4", "5"), ("6", "7"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8a1b,GPU-9c2d,MIG-3e4f,MIG-5a6b")
    assert assign("cuda", gpus_per_run=1).slots == (("GPU-8a1b",), ("GPU-9c2d",), ("MIG-3e4f",), ("MIG-5a6b",))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,9")  # CUDA stopped at the GPU it could not use: two visible
    fake_gpus(monkeypatch, 2)
    assert assign("cuda").slots == (("2", "3"),)


@pytest.mark.parametrize("gpus, expected", [(8, 4), (6, 2), (5, 1), (4, 4), (3, 1), (2, 2), (1, 1)])
def test_the_default_gpus_per_run_share_the_batch_and_keep_the_most_gpus_busy(monkeypatch, gpus, expected):
    """The rehearsal's batch is 4 micro-batches: a run of 3, 5, 6, 7 or 8 GPUs could not share it."""
    fake_gpus(monkeypatch, gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert assign("cuda", share=4).processes_per_run == expected
    assert default_per_run(8, 16) == 8 and default_per_run(6, 16) == 2  # the gpu scale: 1024 = 16 x 64


def test_a_run_size_that_cannot_share_the_batch_is_refused_before_anything_starts(monkeypatch, tmp_path):
    fake_gpus(monkeypatch, 8)
    with pytest.raises(ValueError, match=r"--gpus-per-run 3: .* 4 micro-batches .* choose one of 1, 2, 4"):
        assign("cuda", gpus_per_run=3, share=4)
    with pytest.raises(ValueError, match=r"--processes-per-run 3"):
        assign("cpu", processes_per_run=3, share=4)
    # the plan and the dry run refuse it too, for GPUs that are not here, before any data is written
    result = benchmarks("head", "--scale", "gpu", "--device", "cuda", "--gpus", "8", "--gpus-per-run", "3", "--dry-run")
    assert result.returncode == 2 and "--gpus-per-run 3" in result.stderr and "choose one of 1, 2, 4, 8" in result.stderr
    assert batch_share({"batch_size": 1024, "micro_batch": 64}) == 16 and batch_share({"batch_size": 12}) == 12


def test_a_named_gpu_is_refused_where_each_run_gets_its_own():
    with pytest.raises(ValueError, match="--device cuda with --gpus-per-run"):
        assign("cuda:1")


def test_auto_is_the_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert assign("auto").device == "cpu"


def _report_gpus(run, device, out):
    """A measurement that reports what its process sees (no GPU is touched)."""
    import time

    time.sleep(1.0)  # long enough for the runs of the other sets to overlap with this one
    return {"metrics": {}, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "rank": int(os.environ["RANK"]),
            "world": int(os.environ["WORLD_SIZE"])}


@pytest.mark.slow
def test_runs_at_once_see_only_their_own_gpu_set_and_the_plan_counts_the_same(monkeypatch, tmp_path):
    """A suite under a parent CUDA_VISIBLE_DEVICES (fake GPUs): each run's processes see their set's ids."""
    fake_gpus(monkeypatch, 4)
    monkeypatch.setattr("benchmarks.machine.gpu_name", lambda device: "Fake GPU")  # what the records name
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assignment = assign("cuda", gpus_per_run=2)
    runs = [Run("fake", f"run {i}", {"model": "vit_ti16", "options": {}, "train": {}}, seed=i) for i in range(4)]
    from benchmarks.runner import execute

    results = execute(runs, _report_gpus, ResultStore(tmp_path), assignment, quiet=True)  # the suite's own path
    assert len(results) == 4
    assert all(r["world"] == 2 and r["rank"] == 0 for r in results)  # two processes each, rank 0 reports
    assert {r["visible"] for r in results} == {"4,5", "6,7"}  # each launching process keeps its set
    assert all(r["visible"] == ",".join(r["gpus"]) for r in results)  # and the record names the GPUs it used
    results = [{**r, "slot": r["gpus"]} for r in results]
    intervals = sorted((r["started"], r["started"] + r["wall_s"], tuple(r["slot"])) for r in results)
    # overlapping by more than the records' rounding (wall time to 0.01 s)
    overlapping = [(a, b) for i, a in enumerate(intervals) for b in intervals[i + 1:] if b[0] < a[1] - 0.02]
    assert overlapping and all(a[2] != b[2] for a, b in overlapping)  # runs at once never share a GPU
    # the plan divides by the same number of runs at once, and times each run on its set's GPUs
    gpu = assign("cuda", gpus_per_run=2, stated_gpus=4)
    plans = [planning.plan_ablation(ABLATIONS["head"], get_scale("paper", "imagenet"), set(), a)
             for a in (Assignment("local", "cuda", "stated", 2, gpu.slots, 1, present=False),
                       Assignment("local", "cuda", "stated", 2, gpu.slots[:1], 1, present=False))]
    assert plans[0].minutes == pytest.approx(plans[1].minutes / assignment.runs_at_once, rel=1e-9)
    assert plans[0].device_hours == pytest.approx(plans[1].device_hours)


def _fail_or_sleep(run, device, out):
    """The first run fails at once; the others take a while, each leaving a mark that it started."""
    import time

    if run.group.get("fails"):
        raise RuntimeError("this run's data is missing")
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out).parent / f"started-{run.seed}").touch()
    time.sleep(1.5)
    return {"metrics": {"test_acc": 0.5}}


@pytest.mark.slow
def test_a_failed_run_cancels_the_runs_not_started_and_keeps_those_running(tmp_path):
    """One failure in a long queue is reported as soon as the runs already going are in, not after every
    queued run has trained."""
    from benchmarks.runner import execute

    runs = [Run("fake", "broken", {"x": 0}, 0, {"fails": True})] + [Run("fake", "fine", {"x": 1}, s) for s in range(1, 13)]
    store = ResultStore(tmp_path)
    with pytest.raises(RuntimeError, match="data is missing"):
        execute(runs, _fail_or_sleep, store, assign("cpu", workers=2), quiet=True)
    started = len(list((tmp_path / "runs").glob("started-*")))
    store.refresh()
    # the runs already going and those the pool had handed on before the failure was seen (the workers, 2, and
    # their call queue, workers + 1 = 3, which cannot be cancelled; on a busy machine the queue refills before
    # the failure is read): at most 5, not all twelve
    assert 1 <= started <= 5
    assert len(store.keys()) == started  # every run that ran is stored


def test_the_dry_run_describes_the_assignment_the_launcher_uses():
    result = benchmarks("head", "--scale", "paper", "--device", "cuda", "--gpus", "8", "--gpus-per-run", "4", "--dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "2 run(s) at once, each 4 GPU(s)" in result.stdout and "GPU-hours" in result.stdout


def test_a_gpu_run_is_refused_without_a_gpu_unless_planning():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = benchmarks("head", "--scale", "rehearsal", "--device", "cuda", "--out", "/nonexistent")
    assert result.returncode == 2 and "no CUDA GPU is visible here" in result.stderr


# ---------------------------------------------------------------------------- sizes derived from the data
def test_an_epoch_is_the_dataset_s_not_sixty_thousand_images():
    cifar = {"data": "cifar10", "batch_size": 512}
    assert train_images(cifar) == 50_000 and evaluate_per_epoch(cifar, per_epoch=2)["eval_every"] == 48
    imagenet = {"data": "/no/such/imagenet", "batch_size": 4096}  # a folder not here: ImageNet-1k assumed
    assert evaluate_per_epoch(imagenet)["eval_every"] == 1_281_167 // 4096
    fashion = {"data": "fashion-mnist", "batch_size": 128}  # the CPU scales' (their run keys unchanged)
    assert evaluate_per_epoch(fashion)["eval_every"] == 60_000 // 128


def test_the_data_ablation_holds_out_the_paper_s_share_of_any_dataset():
    from benchmarks.ablations.data_size import subsets

    assert subsets(get_scale("paper", "imagenet")) == ((10_000, 100_000, 1_000_000), 50_000)  # the paper's own
    sizes, validation = subsets(get_scale("paper", "cifar10"))  # was 50,000 of CIFAR's 50,000: a ConfigError
    assert validation == 1_951 and sizes == (4096, 4096, 39_027)  # at least one global batch (4096) each
    for run in ABLATIONS["data"].runs(get_scale("paper", "cifar10")):
        train = run.config["train"]
        assert train["val_size"] + train["train_limit"] <= 50_000


def test_the_rehearsal_shrinks_every_dimension_and_keeps_cells_apart(tmp_path):
    b16, l16 = rehearsal_model("vit_b16", {"img_size": 224}), rehearsal_model("vit_l16", {"img_size": 224})
    assert (b16["embed_dim"], b16["depth"], b16["patch_size"], b16["img_size"]) == (24, 3, 4, 32)
    assert l16["embed_dim"] > b16["embed_dim"] and l16["depth"] > b16["depth"]
    hybrid = rehearsal_model("vit_b16_hybrid", {"img_size": 224})  # R50's (3, 4, 9): 16 blocks, a quarter in two stages
    assert hybrid["stem_options"]["layers"] == (2, 2) and hybrid["img_size"] == 32
    scale = get_scale("rehearsal", str(image_folder(tmp_path / "imagenet")))
    for spec in ABLATIONS.values():
        configs = [json.dumps(r.config, sort_keys=True) for r in spec.runs(scale) if r.seed == 0]
        assert len(set(configs)) == len(configs), spec.name


@pytest.mark.slow
def test_the_gpu_scale_is_planned_on_one_8_gpu_node_with_its_loaders_and_its_start():
    """The plan states its hours at the recorded loader rates and start-up (benchmarks/results/loader/):
    the small models' runs wait for the loaders (8 workers a GPU decode far fewer images than a GPU trains
    a ViT-B/32 on), and a plan over its day says so in words, not only in the budget column."""
    result = benchmarks("all", "--scale", "gpu", "--device", "cuda", "--gpus", "8", "--dry-run")
    assert result.returncode == 0, result.stderr[-2000:]
    total = next(line for line in result.stdout.splitlines() if line.startswith("| all |")).split("|")
    assert "recorded rate of one worker" in result.stdout and "loader (" in total[9]
    over = float(total[5]) > 24 * 60
    assert ("OVER 1440" if over else "within 1440") in total[8]
    assert ("**Over budget: " in result.stdout) == over


# ---------------------------------------------------------------------------- the probe
def test_the_probe_trains_in_the_run_s_precision_and_names_an_out_of_memory(monkeypatch):
    run = ABLATIONS["head"].runs(get_scale("paper", "imagenet"))[0]
    assert planning.run_precision(run, "cpu") == "float32"
    monkeypatch.setattr("vitzoo.precision.native_bf16", lambda device: True)
    assert planning.run_precision(run, "cuda") == "bfloat16"  # --precision auto on a GPU with native bf16
    monkeypatch.setattr("vitzoo.precision.native_bf16", lambda device: False)
    assert planning.run_precision(run, "cuda") == "float16"  # ... and on one that only emulates it

    def no_room(*args, **kwargs):
        raise planning.OutOfMemory("vit_b16 at micro-batch 64 in bfloat16 does not fit on Fake GPU")

    monkeypatch.setattr(planning, "probe_images_per_s", no_room)
    cpu = Assignment("local", "cpu", "a CPU", 1, ((),), 1)
    made = planning.plan_ablation(ABLATIONS["head"], get_scale("paper", "imagenet"), set(), cpu)
    assert "does not fit" in made.problem
    text = planning.describe([made], get_scale("paper", "imagenet"), cpu, planning.STATED_GPU_TFLOPS)
    assert "head cannot run as planned" in text and "| n/a |" in text


# ---------------------------------------------------------------------------- gpu-check
def test_gpu_check_says_so_and_fails_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: gpu-check would run")
    result = benchmarks("gpu-check", timeout=120)
    assert result.returncode == 2 and "no GPU to check" in result.stderr


def test_gpu_check_reports_every_step_and_keeps_the_finished_ones_when_stopped_midway(monkeypatch, tmp_path):
    """A failed step is reported and the next still runs; a check stopped midway (killed at the device's
    time limit) has written the steps it finished."""
    from benchmarks import gpu_check

    def broken(out):
        raise RuntimeError("the kernel is missing")

    def stopped(out):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(gpu_check, "STEPS", {"first": lambda out: {"figure": 1.5}, "second": broken})
    assert gpu_check.main(["--out", str(tmp_path / "a")]) == 1
    written = json.loads((tmp_path / "a" / "gpu_check.json").read_text())
    assert written["verdict"] == "FAILED: second" and written["steps"]["first"]["figure"] == 1.5
    assert "the kernel is missing" in written["steps"]["second"]["error"]
    assert "## second: failed" in (tmp_path / "a" / "README.md").read_text()

    monkeypatch.setattr(gpu_check, "STEPS", {"first": lambda out: {"figure": 1.5}, "second": stopped})
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--out", str(tmp_path / "b")])
    written = json.loads((tmp_path / "b" / "gpu_check.json").read_text())
    assert written["verdict"].startswith("running") and written["steps"]["first"]["status"] == "passed"


def test_the_speed_benchmark_times_the_half_precision_the_gpu_computes(monkeypatch):
    from benchmarks.speed import precisions

    assert list(precisions(torch.device("cpu"))) == ["float32", "bf16"]
    monkeypatch.setattr("vitzoo.precision.native_bf16", lambda device: False)  # a T4 or a V100
    assert list(precisions(torch.device("cuda", 0))) == ["float32", "fp16"]
    monkeypatch.setattr("vitzoo.precision.native_bf16", lambda device: True)  # an A100 or an H100
    assert list(precisions(torch.device("cuda", 0))) == ["float32", "bf16"]


# ---------------------------------------------------------------------------- on a GPU (skipped without one)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@CUDA
def test_on_a_gpu_the_probe_trains_in_the_run_s_precision_and_reports_what_does_not_fit():
    run = ABLATIONS["head"].runs(get_scale("paper", "imagenet"))[0]
    key = planning._model_key(run)
    precision = planning.run_precision(run, "cuda")
    assert precision in ("bfloat16", "float16")
    assert planning.probe_images_per_s(key, "cuda", 1, precision, steps=2) > 0
    huge = json.dumps({**json.loads(key), "model": "vit_h14", "batch": 65_536})
    with pytest.raises(planning.OutOfMemory, match="does not fit"):
        planning.probe_images_per_s(huge, "cuda", 1, precision, steps=1)


@CUDA
@pytest.mark.slow
def test_on_a_gpu_the_rehearsal_trains_each_run_on_its_gpu_set(tmp_path):
    result = benchmarks("head", "--scale", "rehearsal", "--device", "cuda", "--seeds", "1", "--out", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    records = json.loads((tmp_path / "head" / "results.json").read_text())["runs"]
    assert len(records) == 4 and all(r["device"] == "cuda" and r["gpus"] for r in records)
    assert {r["world_size"] for r in records} == {len(records[0]["gpus"])}
