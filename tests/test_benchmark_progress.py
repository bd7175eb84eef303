"""The suite's progress bar moves inside runs (issue 35 item 5): `./run.sh main` had shown `0/4 runs`
for the 9 minutes of its first run."""

from __future__ import annotations

import io
import json

from tqdm import tqdm

from benchmarks.progress import InRunProgress, run_progress


def write_run(folder, config: dict, lines: list[dict], tail: str = "") -> None:
    train = folder / "train"
    train.mkdir(parents=True, exist_ok=True)
    (train / "train_config.json").write_text(json.dumps(config))
    (train / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + tail)


def test_a_runs_progress_is_read_from_its_folder_whatever_its_length_is_counted_in(tmp_path):
    assert run_progress(tmp_path / "not yet") is None
    write_run(tmp_path / "steps", {"steps": 200}, [{"step": 50, "epoch": 0.5, "train_seconds": 9.0},
                                                    {"step": 50, "eval_top1": 0.3}], tail='{"step": 6')
    assert run_progress(tmp_path / "steps") == (0.25, "step 50/200")
    write_run(tmp_path / "epochs", {"epochs": 4.0}, [{"step": 30, "epoch": 1.0, "train_seconds": 9.0}])
    assert run_progress(tmp_path / "epochs") == (0.25, "step 30, epoch 1.00/4")
    write_run(tmp_path / "minutes", {"time_budget_min": 10.0}, [{"step": 30, "epoch": 1.0, "train_seconds": 300.0}])
    assert run_progress(tmp_path / "minutes") == (0.5, "5.0/10 min")
    write_run(tmp_path / "done", {"steps": 10}, [{"step": 10, "epoch": 1.0, "train_seconds": 1.0}])
    assert run_progress(tmp_path / "done")[0] == 0.99  # whole only when its result is stored


def test_the_bar_moves_by_the_runs_in_flight_and_counts_a_measured_run_whole(tmp_path):
    output = io.StringIO()
    bar = tqdm(total=4, unit="run", file=output, mininterval=0)
    runs = {"a": ("learned seed 0", tmp_path / "a"), "b": ("none seed 0", tmp_path / "b")}
    write_run(tmp_path / "a", {"steps": 100}, [{"step": 40, "epoch": 0.4, "train_seconds": 4.0}])
    with InRunProgress(bar, runs, poll_s=3600) as progress:  # polled here by hand, not by its thread
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
