"""What a run reports: RUN/metrics.jsonl as it trains, a JSON line per log and evaluation (a
resumed run drops those its checkpoint had not reached), and TensorBoard's logs; once it stops the
saved model and summary.json, its record.
"""

from __future__ import annotations

import json
import signal
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import vitzoo
from vitzoo.errors import TrainingDiverged
from vitzoo.evaluate import fewshot_linear_accuracy
from vitzoo.io import out_of_space, write_text
from vitzoo.train import distributed
from vitzoo.train.checkpoint import disk_full, latest, save_model, tensor_bytes
from vitzoo.train.inputs import shared_features
from vitzoo.weights.layout import CONFIG_NAME, WEIGHTS_NAME


def json_text(document: Any) -> str:
    return json.dumps(document, indent=2) + "\n"


class Metrics:
    """metrics.jsonl and TensorBoard's logs, written by rank 0 (a no-op elsewhere)."""

    def __init__(self, run: Path | None, enabled: bool, resume_step: int,
                 tensorboard: bool) -> None:
        self.file, self.tb, records = None, None, []
        if run is None or not enabled:
            return
        path = run / "metrics.jsonl"
        for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else ():
            try:  # a killed run's last line may be half-written
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step", 0) <= resume_step:
                records.append(record)
        write_text(path, "".join(json.dumps(r) + "\n" for r in records))
        self.file = open(path, "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(run / "tensorboard"))
            except ImportError:
                warnings.warn("tensorboard is not installed, so this run writes no TensorBoard "
                              "logs: pip install tensorboard, or --no-tensorboard", stacklevel=2)

    def write(self, record: dict[str, Any], tensorboard: bool = True) -> None:
        """One line: `record`'s step and values (to TensorBoard too unless not `tensorboard`)."""
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        for key, value in record.items() if self.tb is not None and tensorboard else ():
            if key != "step" and isinstance(value, (int, float)):
                self.tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


def scores(prefix: str, result: dict[str, float], step: int | None = None) -> dict[str, Any]:
    """<prefix>_top1, _top5 and _loss of an evaluation (None where not measured), with its step."""
    line = {} if step is None else {"step": step}
    return {**line, **{f"{prefix}_{key}": result.get(key) for key in ("top1", "top5", "loss")}}


def record(trainer, final: dict[str, float], val_final: dict[str, float],
           fewshot: dict) -> dict[str, Any]:
    """What summary.json says of the run."""
    cfg, val_set, seconds = trainer.cfg, trainer.inputs.val_set, trainer.train_seconds
    stopped_by = trainer.flag.get("signal")
    summary = {
        "status": trainer.status, "signal": signal.Signals(stopped_by).name if stopped_by else None,
        "step": trainer.step, "total_steps": trainer.total_steps,
        "epochs": trainer.step / trainer.steps_per_epoch, "final_loss": trainer.loss_value,
        **scores("test", final), "fewshot": {str(k): v for k, v in fewshot.items()},
        "train_seconds": seconds, "wall_seconds": time.perf_counter() - trainer.wall_start,
        "images_per_s": trainer.images_seen / seconds if seconds else None,
        "images_seen": trainer.images_seen, "params": vitzoo.count_params(trainer.model),
        "world_size": trainer.env.world_size, "device": str(trainer.device),
        "precision": str(trainer.amp_dtype or torch.float32).replace("torch.", ""),
        "torch": torch.__version__, "model_config": trainer.model.config.to_dict(),
        "train_config": cfg.to_dict(),
        "run_dir": str(trainer.run_dir) if trainer.run_dir else None,
    }
    if val_set is not None:  # the final weights' (None for a run that did not finish)
        summary.update(train_images=len(trainer.inputs.train_set), val_images=len(val_set),
                       **scores("val", val_final))
    if cfg.keep_best:
        summary.update(best_step=trainer.best["step"], best_val_top1=trainer.best["val_top1"])
    if trainer.ema is not None:  # the moving average's
        summary.update(scores("ema_test", trainer.ema_final))
        if val_set is not None:
            summary.update(scores("ema_val", trainer.ema_val_final))
    return summary


def finish(trainer, final: dict[str, float], val_final: dict[str, float]) -> dict[str, Any]:
    """Few-shot accuracy (each rank a share of the features), the summary, and from rank 0 the
    saved model and summary.json."""
    cfg, run, model, ema = trainer.cfg, trainer.run_dir, trainer.model, trainer.ema
    done, ema = trainer.status == "finished", ema and ema.module
    fewshot = {}
    if cfg.fewshot and done:  # a failure here keeps the last checkpoint: --resume finishes
        features = shared_features(model, trainer.env, trainer.inputs.eval_batches)
        fewshot = fewshot_linear_accuracy(model, trainer.inputs.train_eval_set,
                                          trainer.inputs.test_set, cfg.fewshot, draws=5,
                                          seed=cfg.seed, features=features)
    model.eval()
    summary = record(trainer, final, val_final, fewshot)
    if trainer.env.is_main and run is not None:
        try:
            if done or not (run / CONFIG_NAME).exists():
                card = {"dataset": cfg.data, "metrics": {"accuracy": final.get("top1"),
                                                         "top5_accuracy": final.get("top5")}}
                save_model(model, ema, run, extra={"data": cfg.data}, card=card if final else None)
            write_text(run / "summary.json", json_text(summary))
        except Exception as exc:  # a full disk: the last checkpoint holds the trained weights
            if not out_of_space(exc):
                raise
            raise disk_full(run, run, f"the trained model ({WEIGHTS_NAME}) and summary.json",
                            tensor_bytes(model.state_dict()), latest(run / "checkpoints")) from exc
    distributed.barrier(trainer.env)
    if done:
        trainer.say(f"done: {trainer.step} steps in {trainer.train_seconds:.0f} s, test top-1 "
                    f"{final['top1']:.4f}" + (f" -> {run}" if run else ""))
    else:
        trainer.say(f"{trainer.status} at step {trainer.step}; continue with `vitzoo train "
                    f"--resume {run}`")
    return summary


def diverged(trainer, exc: TrainingDiverged) -> TrainingDiverged:
    """summary.json says so; the error says where the last good checkpoint is, what to check."""
    run = trainer.run_dir
    where = "no checkpoint was written" + (f": remove {run} to start again there" if run else "")
    if trainer.last_checkpoint is not None and run is not None:
        where = f"the last good checkpoint (step {trainer.last_checkpoint}) is in {run}/checkpoints"
    if trainer.env.is_main and run is not None:
        write_text(run / "summary.json", json_text({"status": "diverged", "step": exc.step,
                                                    "error": str(exc)}))
    advice = ("check the images and the model's mean and std (--mean, --std)" if exc.inputs
              else "lower the learning rate (--lr) or check the data")
    return TrainingDiverged(f"training stopped: {exc}; {where}. Then {advice}",
                            inputs=exc.inputs, step=exc.step)
