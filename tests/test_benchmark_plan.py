"""The plan and its assignment: which devices each run gets, how many go at once, and what the
runs cost in FLOPs and minutes (`--dry-run`), for GPUs here, stated, or on a cluster."""

import json

import pytest
import torch

import benchmarks.__main__ as bench
from benchmarks import plan as planning
from benchmarks.ablations import ABLATIONS
from benchmarks.assignment import Assignment, assign, batch_share
from benchmarks.scales import SCALES, get_scale

STATED_NODE = Assignment("local", "cuda", "stated", 8, (tuple("01234567"),), 1, present=False)


def fake_gpus(monkeypatch, count: int, visible: str | None = None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


def test_gpus_are_cut_into_disjoint_sets_named_as_this_process_sees_them(monkeypatch):
    fake_gpus(monkeypatch, 8)
    assert assign("cuda").slots == (tuple("01234567"),)  # default: every GPU
    pairs = assign("cuda", gpus_per_run=2)
    assert pairs.slots == (("0", "1"), ("2", "3"), ("4", "5"), ("6", "7"))
    odd = assign("cuda", gpus_per_run=3)
    assert odd.slots == (("0", "1", "2"), ("3", "4", "5")) and "2 GPU(s) idle" in odd.describe()
    with pytest.raises(ValueError, match="8 visible GPU"):
        assign("cuda", gpus_per_run=16)
    fake_gpus(monkeypatch, 4, "GPU-8a1b,GPU-9c2d,MIG-3e4f,MIG-5a6b")  # a suite started on these
    assert assign("cuda", gpus_per_run=2).slots == (("GPU-8a1b", "GPU-9c2d"),
                                                    ("MIG-3e4f", "MIG-5a6b"))
    fake_gpus(monkeypatch, 2, "2,3,9")  # CUDA stopped at the one it could not use
    assert assign("cuda").slots == (("2", "3"),)
    with pytest.raises(ValueError, match="--device cuda with --gpus-per-run"):
        assign("cuda:1")


@pytest.mark.parametrize("gpus, expected", [(8, 4), (6, 2), (5, 1), (3, 1), (2, 2)])
def test_a_run_gets_the_gpus_that_share_its_batch_and_keep_most_busy(monkeypatch, gpus, expected):
    fake_gpus(monkeypatch, gpus)
    assert assign("cuda", share=4).processes_per_run == expected  # the rehearsal's 4 micro-batches


def test_a_run_size_that_cannot_share_the_batch_is_refused_before_anything_starts(monkeypatch):
    fake_gpus(monkeypatch, 8)
    with pytest.raises(ValueError, match=r"--gpus-per-run 3: .* 4 micro-batches .* 1, 2, 4$"):
        assign("cuda", gpus_per_run=3, share=4)
    with pytest.raises(ValueError, match=r"--processes-per-run 3"):
        assign("cpu", processes_per_run=3, share=4)
    assert batch_share({"batch_size": 1024, "micro_batch": 64}) == 16
    with pytest.raises(SystemExit):  # the dry run of GPUs not here refuses it too
        bench.parse(["head", "--scale", "gpu", "--device", "cuda", "--gpus-per-run", "3",
                     "--dry-run"])


def test_the_probe_trains_in_the_runs_precision_and_a_run_that_does_not_fit_is_named(monkeypatch):
    run = ABLATIONS["head"].runs(get_scale("paper", "imagenet"))[0]
    assert planning.run_precision(run, "cpu") == "float32"
    monkeypatch.setattr("vitzoo.precision.native_bf16", lambda device: True)
    assert planning.run_precision(run, "cuda") == "bfloat16"
    monkeypatch.setattr("vitzoo.precision.native_bf16", lambda device: False)
    assert planning.run_precision(run, "cuda") == "float16"  # a GPU that only emulates bf16
    quick = ABLATIONS["head"].runs(SCALES["quick"])[0]
    assert planning.probe_images_per_s(planning._model_key(quick), "cpu", 1) > 0

    def no_room(*args, **kwargs):
        raise planning.OutOfMemory("vit_b16 at micro-batch 64 in bfloat16 does not fit")

    monkeypatch.setattr(planning, "probe_images_per_s", no_room)
    cpu = Assignment("local", "cpu", "a CPU", 1, ((),), 1)
    made = planning.plan_ablation(ABLATIONS["head"], get_scale("paper", "imagenet"), set(), cpu)
    text = planning.describe([made], get_scale("paper", "imagenet"), cpu, 125.0)
    assert "head cannot run as planned**: vit_b16 at micro-batch 64" in text and "| n/a |" in text


def test_the_main_job_and_every_cpu_ablation_plan_within_their_budgets(monkeypatch):
    """At the recorded probe of every model (one thread each, on the CPU it names: not this
    machine's load), two one-thread runs at once, as on a 2-core machine."""
    recorded = json.loads(planning.THROUGHPUT.read_text())

    def recorded_probe(key: str, *args) -> float:
        assert key in recorded["images_per_s"], "not probed yet: python -m benchmarks.plan --record"
        return recorded["images_per_s"][key]

    monkeypatch.setattr(planning, "probe_images_per_s", recorded_probe)
    two_workers = Assignment("local", "cpu", recorded["environment"]["cpu"], 1, ((), ()), 1)
    main = planning.plan_ablation(ABLATIONS["pos_embed"], SCALES["main"], set(), two_workers)
    assert main.minutes <= SCALES["main"].suite_budget_min
    cpu = SCALES["cpu"]
    plans = [planning.plan_ablation(spec, cpu, set(), two_workers) for spec in ABLATIONS.values()]
    assert not [(p.name, round(p.minutes)) for p in plans if p.minutes > cpu.budget_min]
    assert sum(p.minutes for p in plans) <= cpu.suite_budget_min


def test_a_run_of_image_files_trains_no_faster_than_its_loaders_feed_it(monkeypatch):
    """ViT-B/16 at 128 px: 125 TFLOP/s a GPU is about 3,700 images/s; 8 workers a GPU of the
    recorded ~500 images/s feed about 4,000: GPU-bound, and loader-bound at 500 TFLOP/s."""
    scale = get_scale("gpu", "imagenet")
    run = next(r for r in ABLATIONS["head"].runs(scale) if r.config["model"] == "vit_b16")
    assert planning.run_time(run, STATED_NODE, 125.0)[1] == "GPU"
    seconds, bound = planning.run_time(run, STATED_NODE, 500.0)
    assert bound == "loader" and seconds > planning.work(run.config["train"])[0] / (8 * 8 * 500.0)
    tensors = ABLATIONS["head"].runs(SCALES["cpu"])[0]  # Fashion-MNIST: tensors, no loader
    cpu = Assignment("local", "cpu", "a CPU", 1, ((),), 1)
    trained, evaluated = planning.work(tensors.config["train"])
    monkeypatch.setattr(planning, "probe_images_per_s", lambda *args: 100.0)
    seconds, bound = planning.run_time(tensors, cpu, 0.0)
    assert bound == "CPU"
    assert seconds == pytest.approx(planning.BUILD_S + (trained + evaluated / 3) / 100)
    plans = [planning.plan_ablation(ABLATIONS[n], scale, set(), STATED_NODE, 500.0)
             for n in ("head", "cost")]
    assert [p.bound for p in plans] == ["loader", ""]  # cost times, it does not train
    text = planning.describe([plans[0], planning.AblationPlan(**{**plans[0].__dict__,
                                                                 "minutes": 1800.0})],
                             scale, STATED_NODE, 500.0)
    assert "recorded rate of one worker" in text and "**Over budget: " in text


def test_a_dry_run_plans_gpus_that_are_not_here_and_writes_nothing(monkeypatch, tmp_path, capsys):
    from benchmarks.ablations import transfer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(planning, "image_flops", lambda key: 1e9)  # counting ViT-H's takes minutes
    out = tmp_path / "out"
    assert bench.main(["head", "transfer", "--scale", "paper", "--device", "cuda", "--gpus", "8",
                       "--gpus-per-run", "4", "--dry-run", "--out", str(out)]) == 0
    assert not out.exists()
    said = capsys.readouterr().out
    assert "Plan at `--scale paper`" in said and "125 TFLOP/s" in said and "GPU-hours" in said
    assert "2 run(s) at once, each 4 GPU(s)" in said
    row = next(line for line in said.splitlines() if line.startswith("| transfer |")).split("|")
    assert int(row[2]) == len(transfer.MODELS) * len(transfer.DATASETS) * 3
    run = ABLATIONS["transfer"].runs(get_scale("paper", "imagenet"))[0]  # its sweep's trainings too
    steps = sum(t["steps"] for t in planning.trainings(run))
    assert planning.training_flops(run) == steps * 512 * 1e9 and len(planning.trainings(run)) == 5
