"""RUN/metrics.jsonl: one JSON line per log, evaluation and the final evaluation, each with its step;
a resumed run first drops the lines of the steps its checkpoint had not reached."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vitzoo.io import write_text


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
        if run is None or not enabled:
            return
        path = run / "metrics.jsonl"
        if path.exists():  # keep what the resumed checkpoint had seen; drop lines of the lost steps
            kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                    if (record := _json_line(line)) is not None and record.get("step", 0) <= resume_step]
            write_text(path, "".join(line + "\n" for line in kept))
        self.file = open(path, "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run / "tensorboard"))
            except ImportError:
                self.tb = None

    def write(self, record: dict[str, Any], tensorboard: bool = True) -> None:
        """One line of `record` (its "step" and values); its numbers to TensorBoard too, unless not
        `tensorboard` (the final evaluation: its curves are those of training)."""
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        if self.tb is not None and tensorboard:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


def scores(prefix: str, result: dict[str, float], step: int) -> dict[str, Any]:
    """A metrics line of an evaluation: {"step", "<prefix>_top1", "<prefix>_top5", "<prefix>_loss"}."""
    return {"step": step, f"{prefix}_top1": result["top1"], f"{prefix}_top5": result["top5"],
            f"{prefix}_loss": result["loss"]}


__all__ = ["Metrics", "scores"]
