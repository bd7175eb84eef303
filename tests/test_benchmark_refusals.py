"""The suite's command refuses what it would ignore or cannot do, a dry run writes nothing, the docs'
figures are the plan's, and two invocations on one --out never train a run twice at once (issue 33
items 9, 10 and 11)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import benchmarks.__main__ as bench
from benchmarks import plan as planning
from benchmarks.ablations import ABLATIONS
from benchmarks.scales import get_scale

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- 9. flags the launcher ignores
@pytest.mark.parametrize("flags, says", [
    (["--nodes", "2"], "--nodes is not read by --launcher local"),
    (["--gpus-per-node", "4"], "--gpus-per-node is not read by --launcher local"),
    (["--partition", "gpu", "--account", "lab"], "--partition, --account are not read by --launcher local"),
    (["--time-limit-min", "30"], "--time-limit-min is not read by --launcher local"),
    (["--no-wait"], "--no-wait is not read by --launcher local"),
    (["--launcher", "submitit-local", "--nodes", "2"], "--nodes is not read by --launcher submitit-local"),
    (["--gpu-tflops", "-5"], "--gpu-tflops must be positive"),
    (["--gpu-tflops", "inf"], "--gpu-tflops must be positive"),
    (["--gpus", "0"], "--gpus must be at least 1"),
])
def test_a_flag_the_launcher_would_ignore_or_a_bad_number_is_refused_when_parsed(flags, says, capsys):
    """`--launcher local --nodes 2` had planned and trained on one machine without a word; --gpu-tflops
    -5 had planned a suite "within" its budget."""
    with pytest.raises(SystemExit) as exit_info:
        bench.parse(["head", "--scale", "quick", "--dry-run", *flags])
    assert exit_info.value.code == 2 and says in capsys.readouterr().err


def test_the_flags_a_launcher_reads_are_taken(tmp_path):
    args = bench.parse(["head", "--scale", "gpu", "--data", "/d", "--device", "cuda", "--launcher", "slurm",
                        "--nodes", "2", "--partition", "gpu", "--no-wait", "--dry-run"])
    assert args.assignment.nodes == 2 and args.partition == "gpu"
    assert bench.parse(["head", "--scale", "quick", "--launcher", "submitit-local", "--time-limit-min", "5",
                        "--dry-run"]).time_limit_min == 5


def test_slurm_without_slurm_is_refused_before_the_plan_and_anything_written(tmp_path, monkeypatch, capsys):
    """No traceback after the plan (submitit's "Could not detect srun"): a usage error first, naming the
    missing commands and the ways on (a login node, --dry-run, --launcher submitit-local)."""
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no sbatch, srun or sacct
    monkeypatch.setattr(planning, "plan_ablation", lambda *a, **k: pytest.fail("planned"))
    code = bench.main(["head", "--scale", "quick", "--launcher", "slurm", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "sbatch, srun, sacct are not found" in err and "--launcher submitit-local" in err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------- 10. a dry run writes nothing
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


# ---------------------------------------------------------------------------- 11. two invocations, one --out
TAKE = """
import sys, time
from pathlib import Path
from benchmarks import claims
while time.time() < float(sys.argv[2]):
    pass
print(claims.take(Path(sys.argv[1])))
"""


def test_of_processes_that_claim_one_run_at_once_exactly_one_holds_it(tmp_path):
    import os
    import subprocess
    import sys
    import time

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = str(time.time() + 2.0)  # every process started and waiting before the first tries
    processes = [subprocess.Popen([sys.executable, "-c", TAKE, str(tmp_path / "run"), start], stdout=subprocess.PIPE,
                                  text=True, env=env) for _ in range(4)]
    assert sorted(process.communicate(timeout=60)[0].strip() for process in processes) == ["False", "False", "False", "True"]


def test_a_claim_is_stale_once_its_owner_is_gone_or_silent(tmp_path):
    import json
    import os
    import subprocess
    import sys
    import time

    from benchmarks import claims

    folder = tmp_path / "run"
    assert claims.take(folder) and claims.take(folder)  # ours, and still ours
    assert claims.holder(folder)["pid"] == os.getpid()
    claims.release(folder)
    assert claims.holder(folder) is None and not (folder / claims.CLAIM).exists()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout
    (folder / claims.CLAIM).write_text(json.dumps({"host": claims.socket.gethostname(), "pid": int(gone)}))
    assert claims.holder(folder) is None and claims.take(folder)  # a process of this host that has ended
    (folder / claims.CLAIM).write_text(json.dumps({"host": "elsewhere", "pid": 1}))
    assert claims.holder(folder) is not None and not claims.take(folder)  # another host's, heard from lately
    old = time.time() - claims.STALE_S - 1
    os.utime(folder / claims.CLAIM, (old, old))
    assert claims.holder(folder) is None and claims.take(folder)  # ... silent for longer than STALE_S


def test_a_run_another_invocation_holds_is_skipped_and_waited_for(tmp_path, monkeypatch, capsys):
    """Two invocations on one --out had both trained every run in the same folders. A run whose folder
    holds another live process's claim is not trained here: the others are, then its result is waited
    for, and this invocation reports all four."""
    import json
    import socket
    import subprocess
    import sys
    import threading

    from benchmarks import claims
    from benchmarks import execute as executing
    from benchmarks.launchers.assign import assign
    from benchmarks.suite import ResultStore, Run, make_record, run_folder

    monkeypatch.setattr(executing, "CLAIM_POLL_S", 0.05)
    store = ResultStore(tmp_path / "out")
    runs = [Run("x", f"r{i}", {"lr": i}, 0) for i in range(4)]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the other invocation, alive
    try:
        held = run_folder(store, runs[2])
        held.mkdir(parents=True)
        (held / claims.CLAIM).write_text(json.dumps({"host": socket.gethostname(), "pid": other.pid}))
        trained = []

        def measure(run, device, out):
            trained.append(run.label)
            if len(trained) == 3:  # meanwhile the other invocation finishes its run and gives up its claim
                def finish():
                    ResultStore(tmp_path / "out").add(make_record(runs[2], {"metrics": {"test_acc": 0.5}}, 1.0, "cpu"))
                    (held / claims.CLAIM).unlink()
                threading.Timer(0.3, finish).start()
            return {"metrics": {"test_acc": 0.5}}

        records = executing.execute(runs, measure, store, assign("cpu"), quiet=True)
    finally:
        other.kill()
        other.wait()
    assert trained == ["r0", "r1", "r3"]
    assert [r["label"] for r in records] == ["r0", "r1", "r2", "r3"]
    assert "1 run(s) of x are being trained by another invocation on this --out" in capsys.readouterr().out
    assert not list((tmp_path / "out").rglob(claims.CLAIM))  # every claim of this invocation given up
