"""What a run leaves behind once it stops: few-shot accuracy, the saved model with its card, summary.json
(the run's record) and its last words; and the record and the error of a run that diverged.

Each takes the `vitzoo.train.loop.Trainer` whose loop is over (not imported here: the loop imports this
module), reads its state and changes none of it but the model's mode.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import torch

import vitzoo
from vitzoo.checkpoints.native import save_pretrained, save_state_dict
from vitzoo.errors import TrainingDiverged
from vitzoo.io import write_text
from vitzoo.train import distributed, state
from vitzoo.train.ema import EMA_WEIGHTS_NAME
from vitzoo.weights.layout import CONFIG_NAME, WEIGHTS_NAME


def finish(trainer, final: dict[str, float], val_final: dict[str, float]) -> dict[str, Any]:
    """Few-shot accuracy (every rank extracts a share of the features), the summary, and on rank 0
    the saved model and summary.json; a few-shot failure is raised once they are written."""
    cfg, run = trainer.cfg, trainer.run_dir
    fewshot, fewshot_error = {}, None
    if cfg.fewshot and trainer.status == "finished":
        try:
            fewshot = trainer.evaluation.fewshot(trainer.train_eval_set, trainer.test_set, cfg.fewshot, seed=cfg.seed)
        except Exception as exc:  # raised once the trained model and summary.json are written
            fewshot_error = exc
    trainer.model.eval()
    summary = record(trainer, final, val_final, fewshot)
    if fewshot_error is not None:
        summary["fewshot_error"] = f"{type(fewshot_error).__name__}: {fewshot_error}"
    if trainer.env.is_main and run is not None:
        try:
            if trainer.status == "finished" or not (run / CONFIG_NAME).exists():
                card = {"dataset": cfg.data, "metrics": {"accuracy": final["top1"], "top5_accuracy": final["top5"]}} if final else None
                save_pretrained(state.OnHost(trainer.model), run, extra={"data": cfg.data}, card=card)
                if trainer.ema is not None:  # beside model.safetensors: `vitzoo eval RUN --ema` reads it
                    save_state_dict(state.host_copy(trainer.ema.module), run / EMA_WEIGHTS_NAME, metadata={"format": "pt"})
            write_text(run / "summary.json", json.dumps(summary, indent=2) + "\n")
        except Exception as exc:  # a full disk: the final checkpoint holds the trained weights, --resume saves them
            if not state.out_of_space(exc):
                raise
            raise state.disk_full(run, run, f"the trained model ({WEIGHTS_NAME}) and summary.json",
                                  state.tensor_bytes(trainer.model.state_dict()), state.latest(run / "checkpoints")) from exc
    distributed.barrier(trainer.env)
    if fewshot_error is not None:
        fewshot_error.add_note(f"few-shot evaluation failed after training; the trained model and summary.json "
                               f"are saved{f' in {run}' if run else ''}")
        raise fewshot_error
    if cfg.keep_best and trainer.status == "finished":
        trainer.say(f"best validation top-1 {trainer.best['val_top1']:.4f} at step {trainer.best['step']}: "
                    "the weights evaluated and saved")
    if trainer.status == "finished":
        trainer.say(f"done: {trainer.step} steps in {trainer.train_seconds:.0f} s, test top-1 {final['top1']:.4f}"
                    + (f" -> {run}" if run else ""))
    else:
        trainer.say(f"{trainer.status} at step {trainer.step}; checkpoint saved, continue with --resume"
                    + (f" (vitzoo train --resume {run})" if run else ""))
    return summary


def record(trainer, final: dict[str, float], val_final: dict[str, float], fewshot: dict) -> dict[str, Any]:
    """What summary.json says of the run."""
    cfg = trainer.cfg
    summary = {
        "status": trainer.status,
        "signal": signal.Signals(trainer.flag["signal"]).name if trainer.flag.get("signal") else None,
        "step": trainer.step,
        "total_steps": trainer.total_steps,
        "epochs": trainer.step / trainer.steps_per_epoch,
        "final_loss": trainer.loss_value,
        "test_top1": final.get("top1"),
        "test_top5": final.get("top5"),
        "test_loss": final.get("loss"),
        "fewshot": {str(k): v for k, v in fewshot.items()},
        "train_seconds": trainer.train_seconds,
        "wall_seconds": time.perf_counter() - trainer.wall_start,
        "images_per_s": trainer.images_seen / trainer.train_seconds if trainer.train_seconds else None,
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
    if trainer.val_set is not None:  # validation scores of the final weights (None for a run that did not finish)
        summary.update(train_images=len(trainer.train_set), val_images=len(trainer.val_set),
                       val_top1=val_final.get("top1"), val_top5=val_final.get("top5"), val_loss=val_final.get("loss"))
    if cfg.keep_best:
        summary.update(best_step=trainer.best["step"], best_val_top1=trainer.best["val_top1"])
    if trainer.ema is not None:  # the moving average's scores (None for a run that did not finish)
        ema, ema_val = getattr(trainer, "ema_final", {}), getattr(trainer, "ema_val_final", {})
        summary.update(ema_test_top1=ema.get("top1"), ema_test_top5=ema.get("top5"), ema_test_loss=ema.get("loss"))
        if trainer.val_set is not None:
            summary.update(ema_val_top1=ema_val.get("top1"), ema_val_top5=ema_val.get("top5"), ema_val_loss=ema_val.get("loss"))
    return summary


def diverged(trainer, exc: TrainingDiverged) -> TrainingDiverged:
    """summary.json says so; the error says where the last good checkpoint is and what to check."""
    run = trainer.run_dir
    where = (f"the last good checkpoint (step {trainer.last_checkpoint}) is in {run / 'checkpoints'}"
             if trainer.last_checkpoint is not None and run is not None else "no checkpoint was written"
             + (f", so nothing can be resumed: remove {run} to start again there, or choose another --out" if run else ""))
    if trainer.env.is_main and run is not None:
        write_text(run / "summary.json",
                   json.dumps({"status": "diverged", "step": exc.step or trainer.step, "error": str(exc)}, indent=2) + "\n")
    advice = ("Check the images and the model's mean and std (--mean, --std)" if exc.inputs
              else "Lower the learning rate (--lr) or check the data")
    return TrainingDiverged(f"training stopped: {exc}; {where}. {advice}", inputs=exc.inputs, step=exc.step)
