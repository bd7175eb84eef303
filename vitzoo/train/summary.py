"""What a run reports: RUN/metrics.jsonl as it trains, and once it stops the saved model,
summary.json (the run's record) and its last words, or the record of a run that diverged.

metrics.jsonl has one JSON line per log and evaluation, each with its step; a resumed run first
drops the lines of the steps its checkpoint had not reached. metrics.csv holds the same numbers as
a table, to plot with nothing installed; TensorBoard's logs when it is installed.
"""

from __future__ import annotations

import csv
import io
import json
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import vitzoo
from vitzoo.weights.native import save_pretrained
from vitzoo.errors import TrainingDiverged
from vitzoo.io import out_of_space, write_text
from vitzoo.train import checkpoint, distributed
from vitzoo.weights.layout import CONFIG_NAME, WEIGHTS_NAME

TENSORBOARD_MISSING = ("tensorboard is not installed, so this run writes no TensorBoard logs (pip "
                       "install tensorboard; --no-tensorboard, or tensorboard=False, turns them "
                       "off without this warning); the same numbers are in metrics.csv and "
                       "metrics.jsonl")
_warned = False  # the missing tensorboard is said once per process, not once per run


def _json_line(line: str) -> dict | None:
    """A metrics line, or None for a blank one or the half-written last line of a killed run."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


class Metrics:
    """metrics.jsonl, metrics.csv (and TensorBoard), written by rank 0; a no-op elsewhere and
    without a run directory."""

    def __init__(self, run: Path | None, enabled: bool, resume_step: int,
                 tensorboard: bool) -> None:
        global _warned
        self.file = self.tb = None
        self.records: list[dict] = []  # what metrics.csv tabulates
        self.columns: list[str] = []
        if run is None or not enabled:
            return
        path = run / "metrics.jsonl"
        if path.exists():  # keep what the resumed checkpoint had seen; drop the lost steps' lines
            kept = [line for line in path.read_text(encoding="utf-8").splitlines()
                    if (record := _json_line(line)) is not None
                    and record.get("step", 0) <= resume_step]
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
                if not _warned:
                    _warned = True
                    warnings.warn(TENSORBOARD_MISSING, stacklevel=2)

    def write(self, record: dict[str, Any], tensorboard: bool = True) -> None:
        """One line of `record` (its "step" and values); to TensorBoard too unless not
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


def scores(prefix: str, result: dict[str, float], step: int) -> dict[str, Any]:
    """A metrics line of an evaluation: its step, <prefix>_top1, <prefix>_top5, <prefix>_loss."""
    return {"step": step, f"{prefix}_top1": result["top1"], f"{prefix}_top5": result["top5"],
            f"{prefix}_loss": result["loss"]}


def finish(trainer, final: dict[str, float], val_final: dict[str, float]) -> dict[str, Any]:
    """Few-shot accuracy (every rank a share of the features), the summary, and on rank 0 the saved
    model and summary.json; a few-shot failure is raised once they are written."""
    cfg, run = trainer.cfg, trainer.run_dir
    fewshot, fewshot_error = {}, None
    if cfg.fewshot and trainer.status == "finished":
        try:
            inputs = trainer.inputs
            fewshot = trainer.evaluation.fewshot(inputs.train_eval_set, inputs.test_set,
                                                 cfg.fewshot, seed=cfg.seed)
        except Exception as exc:  # raised once the trained model and summary.json are written
            fewshot_error = exc
    trainer.model.eval()
    summary = record(trainer, final, val_final, fewshot)
    if fewshot_error is not None:
        summary["fewshot_error"] = f"{type(fewshot_error).__name__}: {fewshot_error}"
    if trainer.env.is_main and run is not None:
        try:
            if trainer.status == "finished" or not (run / CONFIG_NAME).exists():
                metrics = {"accuracy": final.get("top1"), "top5_accuracy": final.get("top5")}
                card = {"dataset": cfg.data, "metrics": metrics} if final else None
                save_pretrained(checkpoint.OnHost(trainer.model), run, extra={"data": cfg.data},
                                card=card)
                if trainer.ema is not None:  # beside model.safetensors: `vitzoo eval RUN --ema`
                    checkpoint.save_ema(trainer.ema.module, run)
            write_text(run / "summary.json", json.dumps(summary, indent=2) + "\n")
        except Exception as exc:  # a full disk: the final checkpoint holds the trained weights
            if not out_of_space(exc):
                raise
            what = f"the trained model ({WEIGHTS_NAME}) and summary.json"
            needed = checkpoint.tensor_bytes(trainer.model.state_dict())
            kept = checkpoint.latest(run / "checkpoints")
            raise checkpoint.disk_full(run, run, what, needed, kept) from exc
    distributed.barrier(trainer.env)
    if fewshot_error is not None:
        fewshot_error.add_note("few-shot evaluation failed after training; the trained model and "
                               f"summary.json are saved{f' in {run}' if run else ''}")
        raise fewshot_error
    if cfg.keep_best and trainer.status == "finished":
        trainer.say(f"best validation top-1 {trainer.best['val_top1']:.4f} at step "
                    f"{trainer.best['step']}: the weights evaluated and saved")
    if trainer.status == "finished":
        trainer.say(f"done: {trainer.step} steps in {trainer.train_seconds:.0f} s, test top-1 "
                    f"{final['top1']:.4f}" + (f" -> {run}" if run else ""))
    else:
        trainer.say(f"{trainer.status} at step {trainer.step}; checkpoint saved, continue with "
                    "--resume" + (f" (vitzoo train --resume {run})" if run else ""))
    return summary


def _scores(prefix: str, result: dict[str, float]) -> dict[str, float | None]:
    return {f"{prefix}_{key}": result.get(key) for key in ("top1", "top5", "loss")}


def record(trainer, final: dict[str, float], val_final: dict[str, float],
           fewshot: dict) -> dict[str, Any]:
    """What summary.json says of the run."""
    cfg, val_set = trainer.cfg, trainer.inputs.val_set
    stopped_by, seconds = trainer.flag.get("signal"), trainer.train_seconds
    summary = {
        "status": trainer.status,
        "signal": signal.Signals(stopped_by).name if stopped_by else None,
        "step": trainer.step,
        "total_steps": trainer.total_steps,
        "epochs": trainer.step / trainer.steps_per_epoch,
        "final_loss": trainer.loss_value,
        **_scores("test", final),
        "fewshot": {str(k): v for k, v in fewshot.items()},
        "train_seconds": trainer.train_seconds,
        "wall_seconds": time.perf_counter() - trainer.wall_start,
        "images_per_s": trainer.images_seen / seconds if seconds else None,
        "images_seen": trainer.images_seen,
        "params": vitzoo.count_params(trainer.model),
        "world_size": trainer.env.world_size,
        "device": str(trainer.device),
        "precision": str(trainer.amp_dtype or torch.float32).replace("torch.", ""),
        "torch": torch.__version__,
        "model_config": trainer.model.config.to_dict(),
        "train_config": cfg.to_dict(),
        "run_dir": str(trainer.run_dir) if trainer.run_dir else None,
    }
    if val_set is not None:  # the final weights' validation scores (None for an unfinished run)
        summary.update(train_images=len(trainer.inputs.train_set), val_images=len(val_set),
                       **_scores("val", val_final))
    if cfg.keep_best:
        summary.update(best_step=trainer.best["step"], best_val_top1=trainer.best["val_top1"])
    if trainer.ema is not None:  # the moving average's scores (None for an unfinished run)
        summary.update(_scores("ema_test", trainer.ema_final))
        if val_set is not None:
            summary.update(_scores("ema_val", trainer.ema_val_final))
    return summary


def diverged(trainer, exc: TrainingDiverged) -> TrainingDiverged:
    """summary.json says so; the error says where the last good checkpoint is and what to check."""
    run = trainer.run_dir
    if trainer.last_checkpoint is not None and run is not None:
        where = (f"the last good checkpoint (step {trainer.last_checkpoint}) is in "
                 f"{run / 'checkpoints'}")
    else:
        where = "no checkpoint was written" + (
            f", so nothing can be resumed: remove {run} to start again there, or choose another "
            "--out" if run else "")
    if trainer.env.is_main and run is not None:
        diverged = {"status": "diverged", "step": exc.step or trainer.step, "error": str(exc)}
        write_text(run / "summary.json", json.dumps(diverged, indent=2) + "\n")
    advice = ("Check the images and the model's mean and std (--mean, --std)" if exc.inputs
              else "Lower the learning rate (--lr) or check the data")
    return TrainingDiverged(f"training stopped: {exc}; {where}. {advice}", inputs=exc.inputs,
                            step=exc.step)
