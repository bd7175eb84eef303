"""`python -m benchmarks` refuses what it would ignore or cannot do, before anything is written;
a dry run writes nothing; the docs' run counts are the plan's."""

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

import benchmarks.__main__ as bench
from benchmarks import plan as planning
from benchmarks.ablations import ABLATIONS
from benchmarks.scales import get_scale

ROOT = Path(__file__).resolve().parents[1]
GPU_SCALE = ["head", "--scale", "gpu", "--data", "/data/imagenet", "--device", "cuda"]


@pytest.mark.parametrize("flags, says", [
    (["--nodes", "2"], "--nodes: read by --launcher slurm only"),
    (["--partition", "gpu", "--account", "lab"], "--partition, --account: read by --launcher"),
    (["--no-wait"], "--no-wait: read by --launcher slurm only"),
    (["--gpu-tflops", "inf"], "--gpu-tflops: must be positive"),
    (["--gpus", "0"], "--gpus: must be at least 1"),
    (["--launcher", "slurm", "--device", "auto"], "say --device cuda or cpu"),
    (["--launcher", "slurm", "--time-limit-min", "-5"], "--time-limit-min: must be positive"),
    (["--launcher", "slurm", "--cpus-per-task", "0"], "--cpus-per-task: must be at least 1"),
    (["--committed", "--out", "mine"], "--committed writes into"),
    ([], "no CUDA GPU is visible here (--dry-run plans for GPUs that are not here)"),
])
def test_a_flag_that_would_be_ignored_or_cannot_work_is_refused_when_parsed(flags, says, capsys):
    if torch.cuda.is_available() and not flags:
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as exit_info:
        bench.parse([*GPU_SCALE, *flags])
    assert exit_info.value.code == 2 and says in capsys.readouterr().err


def test_an_unknown_ablation_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["posembed"])
    assert "unknown ablation 'posembed'" in capsys.readouterr().err


def test_the_flags_slurm_reads_are_taken_for_the_compute_nodes_gpus():
    args = bench.parse([*GPU_SCALE, "--launcher", "slurm", "--nodes", "2", "--gpus-per-node", "4",
                        "--partition", "gpu", "--no-wait", "--time-limit-min", "5"])
    assert args.assignment.processes_per_run == 8
    assert args.assignment.nodes == 2 and args.partition == "gpu" and args.time_limit_min == 5


def test_without_matplotlib_the_benchmarks_say_how_to_install_it_before_they_train(
        monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(SystemExit):
        bench.main(["pos_embed", "--scale", "quick", "--quiet", "--out", str(tmp_path / "out")])
    assert "pip install -e '.[bench]'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_rehearsal_dry_run_writes_nothing_and_plans_the_folder_it_would_write(
        tmp_path, monkeypatch, capsys):
    """Its JPEG folders are planned, not written: the plan counts them as written ones hold them."""
    from benchmarks.rehearsal_data import FolderSpec, image_folder
    from benchmarks.training import dataset_classes, dataset_images

    monkeypatch.setattr(planning, "image_flops", lambda run: 1e9)
    assert bench.main(["head", "transfer", "--scale", "rehearsal", "--dry-run",
                       "--out", str(tmp_path / "out")]) == 0
    assert "| head | 8 | 8 |" in capsys.readouterr().out and list(tmp_path.iterdir()) == []
    small = FolderSpec(classes=3, train_per_class=2, val_per_class=1, side=8)
    for name, write in (("planned", False), ("written", True)):
        train = {"data": str(image_folder(tmp_path / name, small, write=write))}
        assert (dataset_images(train), dataset_classes(train)) == ((6, 3), 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["written"]


def runs_of(scale_name: str, names=tuple(ABLATIONS), seeds: int | None = None) -> int:
    scale = get_scale(scale_name, "/data/imagenet")
    scale = dataclasses.replace(scale, seeds=seeds or scale.seeds)
    return sum(len(ABLATIONS[name].runs(scale)) for name in names)


def test_the_docs_run_counts_are_the_plans():
    gpus = (ROOT / "docs" / "gpus.md").read_text()
    for scale in ("rehearsal", "gpu", "paper"):
        row = re.search(rf"^\| `{scale}` \|.*$", gpus, re.M).group(0)
        assert row.split("|")[4].strip() == str(runs_of(scale)), row
    assert f"one seed, {runs_of('rehearsal', ('head', 'data', 'inspect'), seeds=1)} runs" in gpus
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert f"--device cuda --dry-run`: {runs_of('paper', ('transfer',))} runs" in readme
    assert f"shrunk, {runs_of('rehearsal', ('transfer',))} runs" in readme
