"""The suite's command refuses what it would ignore or cannot do, a dry run writes nothing, the docs'
figures are the plan's, and two invocations on one --out never train a run twice at once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import benchmarks.__main__ as bench
from benchmarks import plan as planning
from benchmarks.ablations import ABLATIONS
from benchmarks.scales import get_scale

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- flags the launcher ignores
@pytest.mark.parametrize("flags, says", [
    (["--nodes", "2"], "--nodes: read by --launcher slurm only"),
    (["--gpus-per-node", "4"], "--gpus-per-node: read by --launcher slurm only"),
    (["--partition", "gpu", "--account", "lab"], "--partition, --account: read by --launcher slurm only"),
    (["--time-limit-min", "30"], "--time-limit-min: read by --launcher slurm only"),
    (["--no-wait"], "--no-wait: read by --launcher slurm only"),
    (["--gpu-tflops", "-5"], "--gpu-tflops must be positive"),
    (["--gpu-tflops", "inf"], "--gpu-tflops must be positive"),
    (["--gpus", "0"], "--gpus must be at least 1"),
])
def test_a_flag_the_launcher_would_ignore_or_a_bad_number_is_refused_when_parsed(flags, says, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(["head", "--scale", "quick", "--dry-run", *flags])
    assert exit_info.value.code == 2 and says in capsys.readouterr().err


def test_the_flags_slurm_reads_are_taken():
    args = bench.parse(["head", "--scale", "gpu", "--data", "/d", "--device", "cuda", "--launcher", "slurm",
                        "--nodes", "2", "--partition", "gpu", "--no-wait", "--time-limit-min", "5", "--dry-run"])
    assert args.assignment.nodes == 2 and args.partition == "gpu" and args.time_limit_min == 5


def test_slurm_without_slurm_is_refused_before_the_plan_and_anything_written(tmp_path, monkeypatch, capsys):
    """A usage error first, naming the missing commands and the ways on (a login node, --dry-run)."""
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch, srun or sacct
    monkeypatch.setattr(planning, "plan_ablation", lambda *a, **k: pytest.fail("planned"))
    code = bench.main(["head", "--scale", "quick", "--launcher", "slurm", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "sbatch, srun, sacct are not found" in err and "--dry-run" in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- a dry run writes nothing
def test_a_rehearsal_dry_run_writes_nothing_and_plans_the_folder_it_would_write(tmp_path, monkeypatch, capsys):
    """The rehearsal's JPEG folders (801 files with the transfer's) are planned, not written: the plan
    counts their classes and images as the written folders hold them."""
    from benchmarks.rehearsal_data import FolderSpec, image_folder
    from benchmarks.training import dataset_images

    monkeypatch.setattr(planning, "probe_images_per_s", lambda *a, **k: 1000.0)  # no timing: what is written matters
    out = tmp_path / "out"
    assert bench.main(["head", "--scale", "rehearsal", "--dry-run", "--out", str(out)]) == 0
    assert "| head | 8 | 8 |" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    planned = {"data": str((out / "data" / "imagenet").resolve()), "batch_size": 1}
    spec = FolderSpec()
    assert dataset_images(planned) == (spec.train_images, spec.val_images)
    assert planning.dataset_classes(planned) == spec.classes
    small = FolderSpec(classes=3, train_per_class=2, val_per_class=1, side=8)  # planned, then written: the same counts
    image_folder(tmp_path / "small", small, write=False)
    counted = (dataset_images({"data": str(tmp_path / "small")}), planning.dataset_classes({"data": str(tmp_path / "small")}))
    assert list(tmp_path.iterdir()) == []
    image_folder(tmp_path / "written", small)
    assert (dataset_images({"data": str(tmp_path / "written")}), planning.dataset_classes({"data": str(tmp_path / "written")})) \
        == counted == ((6, 3), 3)


def runs_of(scale_name: str, names=tuple(ABLATIONS), seeds: int | None = None) -> int:
    import dataclasses

    scale = get_scale(scale_name, "/data/imagenet", None)
    if seeds:
        scale = dataclasses.replace(scale, seeds=seeds)
    return sum(len(ABLATIONS[name].runs(scale)) for name in names)


def test_the_docs_run_counts_are_the_plans():
    """docs/gpus.md's table of scales and benchmarks/README.md's counts, against the runs the plan
    makes (they had said 94 runs for the rehearsal's 144)."""
    gpus = (ROOT / "docs" / "gpus.md").read_text()
    for scale in ("rehearsal", "gpu", "paper"):
        row = re.search(rf"^\| `{scale}` \|.*$", gpus, re.M).group(0)
        assert row.split("|")[4].strip() == str(runs_of(scale)), row
    assert f"one seed, {runs_of('rehearsal', ('head', 'data', 'inspect'), seeds=1)} runs" in gpus
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert f"--scale paper --device cuda --dry-run`: {runs_of('paper', ('transfer',))} runs" in readme
    assert f"`--scale rehearsal`**: the paper scale's code path shrunk, {runs_of('rehearsal', ('transfer',))} runs" in readme


# ---------------------------------------------------------------------------- two invocations, one --out
TAKE = """
import sys
from pathlib import Path
from benchmarks.runner import claim
print("ready", flush=True)
go = Path(sys.argv[2])
while not go.exists():
    pass
print(claim(Path(sys.argv[1])))
"""


def test_of_processes_that_claim_one_run_at_once_exactly_one_holds_it(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    go = tmp_path / "go"
    processes = [subprocess.Popen([sys.executable, "-c", TAKE, str(tmp_path / "run"), str(go)],
                                  stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)]
    assert [process.stdout.readline().strip() for process in processes] == ["ready"] * 4
    go.touch()  # every process imported and waiting: they try at once
    said = sorted(process.communicate(timeout=60)[0].strip() for process in processes)
    assert said == ["False", "False", "False", "True"]


def test_a_claim_is_stale_once_its_owner_is_gone_or_silent(tmp_path):
    import json
    import os
    import subprocess
    import sys
    import time

    import socket

    from benchmarks.runner import CLAIM, STALE_S, claim, holder, release

    folder = tmp_path / "run"
    assert claim(folder) and claim(folder)  # ours, and still ours
    assert holder(folder)["pid"] == os.getpid()
    release(folder)
    assert holder(folder) is None and not (folder / CLAIM).exists()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout
    (folder / CLAIM).write_text(json.dumps({"host": socket.gethostname(), "pid": int(gone)}))
    assert holder(folder) is None and claim(folder)  # a process of this host that has ended
    (folder / CLAIM).write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    assert holder(folder) is not None and not claim(folder)  # another host's, heard from lately
    old = time.time() - STALE_S - 1
    os.utime(folder / CLAIM, (old, old))
    assert holder(folder) is None and claim(folder)  # ... silent for longer than STALE_S


def test_a_run_another_invocation_holds_is_skipped_and_waited_for(tmp_path, monkeypatch, capsys):
    """A run whose folder holds another live process's claim is not trained here: the others are,
    then its result is waited for, and this invocation reports all four."""
    import json
    import socket
    import subprocess
    import sys
    import threading

    from benchmarks.assignment import assign
    from benchmarks.runner import CLAIM, execute
    from benchmarks.suite import ResultStore, Run, make_record, run_folder

    store = ResultStore(tmp_path / "out")
    runs = [Run("x", f"r{i}", {"lr": i}, 0) for i in range(4)]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the other invocation, alive
    try:
        held = run_folder(store, runs[2])
        held.mkdir(parents=True)
        (held / CLAIM).write_text(json.dumps({"host": socket.gethostname(), "pid": other.pid}))
        trained = []

        def measure(run, device, out):
            trained.append(run.label)
            if len(trained) == 3:  # meanwhile the other invocation finishes its run and gives up its claim
                def finish():
                    ResultStore(tmp_path / "out").add(make_record(runs[2], {"metrics": {"test_acc": 0.5}}, 1.0, "cpu"))
                    (held / CLAIM).unlink()
                threading.Timer(0.3, finish).start()
            return {"metrics": {"test_acc": 0.5}}

        records = execute(runs, measure, store, assign("cpu"), quiet=True, claim_poll_s=0.05)
    finally:
        other.kill()
        other.wait()
    assert trained == ["r0", "r1", "r3"]
    assert [r["label"] for r in records] == ["r0", "r1", "r2", "r3"]
    assert "1 run(s) of x are being trained by another invocation on this --out" in capsys.readouterr().out
    assert not list((tmp_path / "out").rglob(CLAIM))  # every claim of this invocation given up
