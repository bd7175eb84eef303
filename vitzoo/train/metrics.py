"""RUN/metrics.jsonl: one JSON line per log, evaluation and the final evaluation, each with its step;
a resumed run first drops the lines of the steps its checkpoint had not reached. RUN/metrics.csv holds the
same numbers as a table (a column per name, a row per line), to plot with nothing installed; TensorBoard's
logs when it is installed (without it, a warning says so once)."""

from __future__ import annotations

import csv
import io
import json
import warnings
from pathlib import Path
from typing import Any

from vitzoo.io import write_text

TENSORBOARD_MISSING = ("tensorboard is not installed, so this run writes no TensorBoard logs (pip install tensorboard; "
                       "--no-tensorboard, or tensorboard=False, turns them off without this warning); the same "
                       "numbers are in metrics.csv and metrics.jsonl")
_warned = False  # the missing tensorboard is said once per process, not once per run


def _json_line(line: str) -> dict | None:
    """A metrics line, or None for a blank one or the half-written last line of a killed run."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


class Metrics:
    """metrics.jsonl (and TensorBoard when installed), written by rank 0; a no-op elsewhere and
    without a run directory."""

    def __init__(self, run: Path | None, enabled: bool, resume_step: int, tensorboard: bool) -> None:
        self.file = None
        self.tb = None
        self.records: list[dict] = []  # what metrics.csv tabulates
        self.columns: list[str] = []
        if run is None or not enabled:
            return
        path = run / "metrics.jsonl"
        if path.exists():  # keep what the resumed checkpoint had seen; drop lines of the lost steps
            kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                    if (record := _json_line(line)) is not None and record.get("step", 0) <= resume_step]
            write_text(path, "".join(line + "\n" for line in kept))
            self.records = [_json_line(line) for line in kept]
        self.csv = run / "metrics.csv"
        self._write_table()
        self.file = open(path, "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run / "tensorboard"))
            except ImportError:
                self.tb = None
                _warn_tensorboard_missing()

    def write(self, record: dict[str, Any], tensorboard: bool = True) -> None:
        """One line of `record` (its "step" and values); its numbers to TensorBoard too, unless not
        `tensorboard` (the final evaluation: its curves are those of training)."""
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        self.records.append(record)
        if all(key in self.columns for key in record):
            with open(self.csv, "a", encoding="utf-8", newline="") as table:
                table.write(self._rows([record]))
        else:  # a new column (the first evaluation's): the table written again, at once
            self._write_table()
        if self.tb is not None and tensorboard:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])

    def _rows(self, records: list[dict]) -> str:
        text = io.StringIO()
        csv.DictWriter(text, self.columns, lineterminator="\n").writerows(
            {k: v for k, v in r.items() if k in self.columns} for r in records)
        return text.getvalue()

    def _write_table(self) -> None:
        self.columns = list(dict.fromkeys(["step", *(key for r in self.records for key in r)]))
        write_text(self.csv, ",".join(self.columns) + "\n" + self._rows(self.records))

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


def _warn_tensorboard_missing() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(TENSORBOARD_MISSING, stacklevel=3)


def scores(prefix: str, result: dict[str, float], step: int) -> dict[str, Any]:
    """A metrics line of an evaluation: {"step", "<prefix>_top1", "<prefix>_top5", "<prefix>_loss"}."""
    return {"step": step, f"{prefix}_top1": result["top1"], f"{prefix}_top5": result["top5"],
            f"{prefix}_loss": result["loss"]}


__all__ = ["Metrics", "scores"]
