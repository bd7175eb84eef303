"""How far the runs in flight are, read from their training folders, so that the suite's progress bar
moves inside runs (`0/4 runs` had stood still for the 9 minutes of a first run): a run counts as the
fraction of its length its last metrics line reached, the bar's estimate of the time left follows, and
the bar names each run's step. Nothing is asked of the processes training: the folder is read as it is.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

POLL_S = 2.0  # how often the folders of the runs in flight are read
BAR_FORMAT = "{l_bar}{bar}| {n:.2f}/{total_fmt} runs [{elapsed}<{remaining}{postfix}]"


def run_progress(folder: Path) -> tuple[float, str] | None:
    """(the fraction of its length a run has trained, its step in words) from `folder`/train's settings and
    its last metrics line; None before its first line (or when what is there cannot be read yet)."""
    train = Path(folder) / "train"
    try:
        config = json.loads((train / "train_config.json").read_text(encoding="utf-8"))
        lines = (train / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return None
    last = None
    for line in reversed(lines):  # the last whole training line (a half-written one is skipped)
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record and "train_seconds" in record:
            last = record
            break
    if last is None:
        return None
    if config.get("steps"):
        fraction, words = last["step"] / config["steps"], f"step {last['step']}/{config['steps']}"
    elif config.get("time_budget_min"):
        fraction = last["train_seconds"] / (60 * config["time_budget_min"])
        words = f"{last['train_seconds'] / 60:.1f}/{config['time_budget_min']:g} min"
    elif config.get("epochs") and last.get("epoch") is not None:
        fraction, words = last["epoch"] / config["epochs"], f"step {last['step']}, epoch {last['epoch']:.2f}/{config['epochs']:g}"
    else:
        return None
    return min(max(fraction, 0.0), 0.99), words  # a run is whole only when its result is stored


class InRunProgress:
    """The suite's tqdm `bar` (one unit a run) advanced by the fractions of the runs in flight, `runs`:
    {key: (label, folder)}, read every POLL_S seconds by a thread while in its `with`; `finish(key)`
    makes a measured run whole."""

    def __init__(self, bar: Any, runs: dict[str, tuple[str, Path]], poll_s: float = POLL_S) -> None:
        self.bar, self.runs, self.poll_s = bar, dict(runs), poll_s
        self.shown: dict[str, float] = {}  # the fraction of each run the bar already counts
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def __enter__(self) -> InRunProgress:
        if not getattr(self.bar, "disable", False):
            self.bar.bar_format = BAR_FORMAT
            self.thread = threading.Thread(target=self._watch, daemon=True, name="in-run progress")
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join()

    def _watch(self) -> None:
        while not self.stopped.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        """Read the folders of the runs in flight once; move the bar by what they trained since."""
        with self.lock:
            words = []
            for key, (label, folder) in list(self.runs.items()):
                found = run_progress(folder)
                if found is None:
                    continue
                fraction, said = found
                if fraction > self.shown.get(key, 0.0):
                    self.bar.update(fraction - self.shown.get(key, 0.0))
                    self.shown[key] = fraction
                words.append(f"{label} {said}")
            if words:
                self.bar.set_postfix_str("; ".join(words), refresh=True)

    def finish(self, key: str) -> None:
        """The run of `key` is measured: it counts whole, and is no longer read."""
        with self.lock:
            self.runs.pop(key, None)
            self.bar.update(1.0 - self.shown.pop(key, 0.0))


__all__ = ["InRunProgress", "run_progress"]
