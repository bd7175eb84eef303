"""The runner: two invocations on one --out never train a run twice at once, a failed run stops
the queue and keeps the runs going, and runs at once train on disjoint GPU sets."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from benchmarks import runner
from benchmarks.runner import assign, claim, execute
from benchmarks.suite import ResultStore, Run, make_record, run_folder

ROOT = Path(__file__).resolve().parents[1]
TAKE = """
import sys
from pathlib import Path
from benchmarks.runner import claim
print("ready", flush=True)
while not Path(sys.argv[2]).exists():
    pass
held = claim(Path(sys.argv[1]))
print(held is not None, flush=True)
sys.stdin.read()
"""


def test_of_processes_claiming_one_run_at_once_one_holds_it_until_it_ends(tmp_path):
    go, env = tmp_path / "go", {**os.environ, "PYTHONPATH": str(ROOT)}
    takers = [subprocess.Popen([sys.executable, "-c", TAKE, str(tmp_path / "run"), str(go)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
              for _ in range(3)]
    try:
        assert [p.stdout.readline().strip() for p in takers] == ["ready"] * 3
        go.touch()  # every process imported and waiting: they try at once
        said = {p: p.stdout.readline().strip() for p in takers}
        assert sorted(said.values()) == ["False", "False", "True"]
        assert claim(tmp_path / "run") is None
        winner = next(p for p, held in said.items() if held == "True")
        winner.kill()  # killed, not released: its claim ends with it
        winner.wait()
        assert claim(tmp_path / "run") is not None
    finally:
        for p in takers:
            p.kill()
            p.wait()


def test_a_run_another_invocation_holds_is_waited_for_and_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "CLAIM_POLL_S", 0.05)
    store = ResultStore(tmp_path)
    runs = [Run("x", f"r{i}", {"lr": i}, 0) for i in range(3)]
    other = claim(run_folder(store, runs[1]))  # the other invocation's
    trained = []

    def measure(run, device, out):
        trained.append(run.label)
        if len(trained) == 2:  # meanwhile the other invocation stores its run and lets go
            def finish():
                ResultStore(tmp_path).add(make_record(runs[1], {"metrics": {}}, 1.0, "cpu"))
                other.close()
            threading.Timer(0.3, finish).start()
        return {"metrics": {}}

    records = execute(runs, measure, store, assign("cpu"), quiet=True)
    assert trained == ["r0", "r2"] and [r["label"] for r in records] == ["r0", "r1", "r2"]
    assert "1 run(s) of x are being trained by another invocation" in capsys.readouterr().out
    assert all(claim(run_folder(store, run)) for run in runs)  # every claim let go


def _fail_or_sleep(run, device, out):
    if run.group.get("fails"):
        raise RuntimeError("this run's data is missing")
    (Path(out).parent / f"started-{run.seed}").touch()
    time.sleep(1.5)
    return {"metrics": {}}


@pytest.mark.slow
def test_a_failed_run_starts_no_further_run_and_keeps_those_going(tmp_path):
    runs = [Run("x", "broken", {}, 0, {"fails": True})]
    runs += [Run("x", "fine", {}, seed) for seed in range(1, 9)]
    two = assign("cpu", workers=2)
    with pytest.raises(RuntimeError, match="data is missing"):
        execute(runs, _fail_or_sleep, ResultStore(tmp_path), two, quiet=True)
    started = len(list((tmp_path / "runs").glob("started-*")))
    # those going and those the pool had handed on (its 2 workers, its queue of 3) at most
    stored = ResultStore(tmp_path).runs
    assert 1 <= started <= 5 and len(stored) == started
    assert {r["threads"] for r in stored} == {two.threads_per_process}  # a worker's, recorded


def _report_gpus(run, device, out):
    time.sleep(1.0)  # long enough for the run on the other set to overlap
    return {"metrics": {}, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"])}


@pytest.mark.slow
def test_runs_at_once_see_only_their_own_gpu_set(monkeypatch, tmp_path):
    """Under a parent CUDA_VISIBLE_DEVICES (fake GPUs), through the elastic launcher."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr("benchmarks.suite.environment", lambda device: {"gpu": "Fake GPU"})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    runs = [Run("x", "r", {}, seed) for seed in range(2)]
    found = execute(runs, _report_gpus, ResultStore(tmp_path), assign("cuda", gpus_per_run=2),
                    quiet=True)
    assert [(r["world"], r["rank"]) for r in found] == [(2, 0), (2, 0)]  # rank 0 reports
    assert {r["visible"] for r in found} == {"4,5", "6,7"}
    assert all(r["visible"] == ",".join(r["gpus"]) for r in found)  # the record names them
    (a, b) = sorted((r["started"], r["started"] + r["wall_s"]) for r in found)
    assert b[0] < a[1]  # at once
