"""The suite's progress bar moves inside the runs in flight, and their claims stay fresh while they
train."""

from __future__ import annotations

import io
import json
import os
import time

from tqdm import tqdm

from benchmarks.runner import CLAIM, InFlight, claim, holder, run_progress


def write_run(folder, config: dict, lines: list[dict], tail: str = "") -> None:
    train = folder / "train"
    train.mkdir(parents=True, exist_ok=True)
    (train / "train_config.json").write_text(json.dumps(config))
    (train / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + tail)


def test_a_runs_progress_is_read_from_its_folder_in_steps_or_epochs(tmp_path):
    assert run_progress(tmp_path / "not yet") is None
    write_run(tmp_path / "steps", {"steps": 200}, [{"step": 50, "epoch": 0.5, "train_seconds": 9.0},
                                                    {"step": 50, "eval_top1": 0.3}], tail='{"step": 6')
    assert run_progress(tmp_path / "steps") == (0.25, "step 50/200")
    write_run(tmp_path / "epochs", {"epochs": 4.0}, [{"step": 30, "epoch": 1.0, "train_seconds": 9.0}])
    assert run_progress(tmp_path / "epochs") == (0.25, "step 30, epoch 1.00/4")
    write_run(tmp_path / "done", {"steps": 10}, [{"step": 10, "epoch": 1.0, "train_seconds": 1.0}])
    assert run_progress(tmp_path / "done")[0] == 0.99  # whole only when its result is stored


def test_the_bar_moves_by_the_runs_in_flight_and_counts_a_measured_run_whole(tmp_path):
    output = io.StringIO()
    bar = tqdm(total=4, unit="run", file=output, mininterval=0)
    write_run(tmp_path / "a", {"steps": 100}, [{"step": 40, "epoch": 0.4, "train_seconds": 4.0}])
    progress = InFlight(bar, every=3600)  # polled here by hand, not by its thread
    progress.runs.update({"a": ("learned seed 0", tmp_path / "a"), "b": ("none seed 0", tmp_path / "b")})
    with progress:
        progress.poll()
        assert bar.n == 0.4 and "learned seed 0 step 40/100" in output.getvalue() and "0.40/4 runs" in output.getvalue()
        write_run(tmp_path / "a", {"steps": 100}, [{"step": 70, "epoch": 0.7, "train_seconds": 7.0}])
        write_run(tmp_path / "b", {"steps": 100}, [{"step": 10, "epoch": 0.1, "train_seconds": 1.0}])
        progress.poll()
        assert abs(bar.n - 0.8) < 1e-9
        progress.finish("a")
        assert abs(bar.n - 1.1) < 1e-9
        progress.poll()  # a finished run is no longer read
        assert abs(bar.n - 1.1) < 1e-9
    bar.close()


def test_the_claim_of_a_run_in_flight_is_kept_fresh(tmp_path):
    folder = tmp_path / "run"
    assert claim(folder)
    old = time.time() - 3600
    os.utime(folder / CLAIM, (old, old))  # silent for an hour: stale
    assert holder(folder) is None
    progress = InFlight(tqdm(total=1, disable=True), every=3600)
    progress.runs["a"] = ("a", folder)
    progress.poll()
    assert holder(folder)["pid"] == os.getpid()
