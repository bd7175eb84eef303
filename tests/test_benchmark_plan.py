"""The plan and its assignment: which devices each run gets, how many go at once, and what the
runs cost in FLOPs and minutes (`--dry-run`) at a stated throughput."""

import pytest
import torch

import benchmarks.__main__ as bench
from benchmarks import plan as planning
from benchmarks.ablations import ABLATIONS
from benchmarks.runner import Assignment, assign
from benchmarks.scales import SCALES, get_scale


def fake_gpus(monkeypatch, count: int, visible: str | None = None) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


def test_gpus_are_cut_into_disjoint_sets_named_as_this_process_sees_them(monkeypatch):
    fake_gpus(monkeypatch, 8)
    assert assign("cuda").slots == (tuple("01234567"),)  # default: every GPU
    pairs = assign("cuda", gpus_per_run=2)
    assert pairs.slots == (("0", "1"), ("2", "3"), ("4", "5"), ("6", "7"))
    assert assign("cuda", gpus_per_run=3).slots == (("0", "1", "2"), ("3", "4", "5"))
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
    with pytest.raises(SystemExit):  # the dry run of GPUs not here refuses it too
        bench.parse(["head", "--scale", "gpu", "--device", "cuda", "--gpus-per-run", "3",
                     "--dry-run"])


def test_the_main_job_and_every_cpu_ablation_plan_within_their_budgets():
    """At the stated throughput of a CPU thread, two one-thread runs at once (2 cores)."""
    two_workers = Assignment("local", "cpu", 1, ((), ()), 1)
    main = planning.plan_ablation(ABLATIONS["pos_embed"], SCALES["main"], set(), two_workers)
    assert main.minutes <= SCALES["main"].suite_budget_min
    cpu = SCALES["cpu"]
    plans = [planning.plan_ablation(spec, cpu, set(), two_workers) for spec in ABLATIONS.values()]
    assert not [(p.name, round(p.minutes)) for p in plans if p.minutes > cpu.budget_min]
    assert sum(p.minutes for p in plans) <= cpu.suite_budget_min


def test_a_dry_run_plans_gpus_that_are_not_here_and_writes_nothing(monkeypatch, tmp_path, capsys):
    from benchmarks.ablations import transfer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(planning, "image_flops", lambda run: 1e9)  # counting ViT-H's takes minutes
    out = tmp_path / "out"
    assert bench.main(["head", "transfer", "--scale", "paper", "--device", "cuda", "--gpus", "8",
                       "--gpus-per-run", "4", "--gpu-tflops", "100", "--dry-run",
                       "--out", str(out)]) == 0
    assert not out.exists()
    said = capsys.readouterr().out
    assert "Plan at `--scale paper`" in said and "100 TFLOP/s" in said and "GPU-hours" in said
    assert "2 run(s) at once, each 4 GPU(s)" in said
    row = next(line for line in said.splitlines() if line.startswith("| transfer |")).split("|")
    assert int(row[2]) == len(transfer.MODELS) * len(transfer.DATASETS) * 3
    runs = ABLATIONS["transfer"].runs(get_scale("paper", "imagenet"))
    run = next(r for r in runs if r.group["dataset"] == "imagenet")  # its sweep's trainings too
    steps = sum(t["steps"] for t in planning.trainings(run))
    assert planning.training_flops(run) == steps * 512 * 1e9 and len(planning.trainings(run)) == 5
    trained, evaluated = map(sum, zip(*map(planning.work, planning.trainings(run))))
    minutes = (planning.BUILD_S + planning.RENDEZVOUS_S["cuda"]
               + (trained + evaluated / 3) * 1e9 / (4 * 100e12)) / 60
    assert float(row[6]) == pytest.approx(minutes, abs=0.05)  # its longest run
