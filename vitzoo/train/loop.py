"""`fit(TrainConfig)`: the training loop, top to bottom, as a `Trainer`.

1. `Trainer.__init__`: the cheap checks (data, run directory, batch arithmetic) before any work;
   data, model, optimizer, length and schedule (vitzoo.train.build, .optim); the last checkpoint
   when resuming (vitzoo.train.checkpoint);
2. `train`: each `train_step` accumulates gradients over micro-batches, agrees across processes on
   the loss, clips and steps; losses stay on the device until logging, evaluating or checkpointing
   reads them (`read_steps`, which stops on a non-finite one); a stop signal ends the loop with a
   checkpoint;
3. `final_evaluation`, then `vitzoo.train.summary.finish`: few-shot accuracy, the saved model and
   summary.json. The global batch is `batch_size` whatever the number of processes.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import vitzoo
from vitzoo import data as datasets
from vitzoo.errors import TrainingDiverged
from vitzoo.io import write_text
from vitzoo.model import choose_attention
from vitzoo.precision import autocast, flag, sum_dtype, training_dtype
from vitzoo.train import build, checkpoint, distributed, summary
from vitzoo.train.build import Evaluation, Inputs
from vitzoo.train.config import TrainConfig
from vitzoo.train.optim import ModelEMA, build_optimizer, horizon, plan_length
from vitzoo.train.summary import Metrics, scores

# steps whose loss and gradient norm may wait on the device before they are read (and checked)
MAX_UNREAD_STEPS = 100


def loss_fn(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Cross-entropy in float32; `targets` are class indices or (MixUp / CutMix) probabilities."""
    return F.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)


def fit(config: TrainConfig) -> dict[str, Any]:
    """Train as `config` says; return the summary (also RUN/summary.json). A caller that needs the
    trained model runs `trainer = Trainer.from_config(config)`, `trainer.run()`, `trainer.model`."""
    return checkpoint.finished_summary(config) or Trainer.from_config(config).run()


class Trainer:
    """One run: `Trainer(cfg, env)` sets everything up; `run()` trains, evaluates, saves and returns
    the summary; `model` is then the trained model. The state a checkpoint holds is set in
    `_resume`, what the loop reads and decides on in `_start_loop`."""

    @classmethod
    def from_config(cls, config: TrainConfig) -> Trainer:
        """The run of `config` (its recipe resolved) in this process (torchrun's, or alone)."""
        cfg = config.resolved()
        return cls(cfg, distributed.setup(cfg.device))

    # ------------------------------------------------------------------------ set-up
    def __init__(self, cfg: TrainConfig, env: distributed.Env) -> None:
        self.cfg, self.env, self.device = cfg, env, env.device
        self.wall_start = time.perf_counter()
        self.verbose = env.is_main and not cfg.quiet
        build.check_data(cfg, env)  # with --download, the first process fetches the files
        self.run_dir = Path(cfg.out) if cfg.out else None
        resume_points = checkpoint.prepare_run_dir(cfg, self.run_dir)
        distributed.barrier(env)  # every rank has checked the run directory before rank 0 writes
        self.micro, self.accum = cfg.batch_split(env.world_size)
        self.exact = sum_dtype(self.device)  # of the loss and clock reductions
        resolved = build.resolve_model(cfg)  # once: the config, and the weights of --pretrained
        train_raw, val_raw, test_raw, info = build.load_splits(cfg, resolved.config)
        torch.manual_seed(cfg.seed)  # the same initial weights on every process
        config = build.dataset_config(cfg, info, resolved)
        self.model = build.build_model(cfg, resolved, config, info.classes).to(self.device)
        self.amp_dtype = training_dtype(cfg.precision, self.device)
        self.inputs = Inputs(cfg, env, self.model.config.img_size, (train_raw, val_raw, test_raw),
                             info.num_classes, self.micro)
        self.steps_per_epoch, self.total_steps, self.budget_s, self.schedule = plan_length(
            cfg, len(self.inputs.train_set))
        self.optimizer = build_optimizer(cfg, self.model, self.device)
        # the moving average starts from the weights training starts from (a resume loads its own)
        self.ema = (ModelEMA(self.model, cfg.model_ema_decay, cfg.model_ema_warmup)
                    if cfg.model_ema else None)
        self.ema_final: dict[str, float] = {}
        self.ema_val_final: dict[str, float] = {}
        reach = horizon(cfg.model_ema_decay)
        if self.ema and not cfg.model_ema_warmup and self.total_steps and reach > self.total_steps:
            warnings.warn(f"model_ema_decay={cfg.model_ema_decay} averages about the last "
                          f"{reach:.0f} steps, more than this run's {self.total_steps}: the EMA "
                          "weights will stay close to the initial ones. Lower --model-ema-decay "
                          "(e.g. 0.99) or add --model-ema-warmup", stacklevel=2)
        self.scaler = torch.amp.GradScaler(self.device.type,
                                           enabled=self.amp_dtype == torch.float16)
        self._resume(resume_points)
        choose_attention(self.model, self.device, self.amp_dtype)  # the kernel of its precision
        if self.ema is not None:
            choose_attention(self.ema.module, self.device, self.amp_dtype)
        if self.run_dir is not None and env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_text(self.run_dir / "train_config.json", cfg.to_json())
        self.wrapped = build.distribute(self.model, cfg.compile, env)  # `model`: evaluated, saved
        self.inputs.make_loader()  # once: its workers are kept between epochs and evaluations

        def evaluation(model: torch.nn.Module) -> Evaluation:  # its workers end with each pass
            return Evaluation(model, env, batch_size=max(self.micro, 256),
                              num_workers=cfg.num_workers, pin_memory=self.device.type == "cuda",
                              autocast_dtype=self.amp_dtype, batches=self.inputs.eval_batches)

        self.evaluation = evaluation(self.model)
        self.ema_evaluation = evaluation(self.ema.module) if self.ema is not None else None

    def say(self, message: str) -> None:
        if self.verbose:
            print(message, file=sys.stderr, flush=True)

    def _resume(self, resume_points: list[Path]) -> None:
        """The checkpointed state: the first readable checkpoint of `resume_points`, or fresh."""
        cfg, env, device = self.cfg, self.env, self.device
        self.step, self.train_seconds, self.images_seen = 0, 0.0, 0
        # the last loss and gradient norm read: a run resumed at its last step reports them
        self.loss_value, self.grad_norm = None, None
        # keep_best: the best validation point so far (weights on the CPU), kept across a resume
        self.best: dict[str, Any] = {"step": None, "val_top1": None, "weights": None}
        self.resume_from = None
        if not resume_points:
            if cfg.resume and env.is_main:  # a run stopped before its first checkpoint: said always
                print(f"no checkpoint in {self.run_dir}: starting from step 0", file=sys.stderr,
                      flush=True)
            torch.manual_seed(cfg.seed + 1 + env.rank)  # dropout, drop-path, mixing differ by rank
            return
        ema = self.ema.module if self.ema is not None else None
        self.resume_from, saved = checkpoint.load_first(resume_points, self.model, device, ema=ema)
        self.amp_dtype = build.resumed_precision(saved.get("precision"), self.amp_dtype, device,
                                                 self.say)
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp_dtype == torch.float16)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.schedule.load_state_dict(saved["schedule"])
        self.scaler.load_state_dict(saved["scaler"])
        self.step, self.train_seconds = saved["step"], saved["train_seconds"]
        self.images_seen = saved["images_seen"]
        self.loss_value, self.grad_norm = saved.get("loss"), saved.get("grad_norm")  # (absent from older checkpoints)
        if len(saved["rng"]) == env.world_size:
            checkpoint.set_rng_state(saved["rng"][env.rank], device)
        else:  # another world size: a fresh stream per process
            torch.manual_seed(cfg.seed + 1 + env.rank + 7919 * self.step)
        if cfg.keep_best:
            self.best.update(saved["best"])
        self.say(f"resuming {self.run_dir} at step {self.step} from {self.resume_from.name}")

    # ------------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        """Train, then (when finished) checkpoint and evaluate; save the model and summary.json."""
        cfg, env = self.cfg, self.env
        length = f"{self.total_steps} steps" if self.total_steps else f"{cfg.time_budget_min} min"
        self.say(f"training {cfg.model} ({vitzoo.count_params(self.model):,} parameters) on "
                 f"{cfg.data}: {len(self.inputs.train_set)} images, batch {cfg.batch_size} = "
                 f"{env.world_size} process(es) x {self.accum} x {self.micro}, {length}, "
                 f"{self.device}, recipe {cfg.recipe}, {self.inputs.describe()}")
        self.metrics = Metrics(self.run_dir, env.is_main, self.step, cfg.tensorboard)
        try:
            self.train()
            done = self.status == "finished"
            final, val_final = self.final_evaluation() if done else self.partial_results()
        finally:
            self.metrics.close()
        return summary.finish(self, final, val_final)

    def train(self) -> None:
        """Steps until the run's length, `stop_at` or a signal; reads, logs, evaluates and
        checkpoints at their points."""
        cfg, config = self.cfg, self.model.config
        self._start_loop()
        batches = self.inputs.micro_batches(self.step, self.steps_per_epoch)
        normalize = datasets.Normalizer(config.mean, config.std, config.in_chans, self.device)
        self.wrapped.train()
        try:
            with distributed.stop_signals(self.flag):
                while not self.finished():
                    lr, stop_requested = self.train_step(batches, normalize)
                    logging = self.step % cfg.log_every == 0 or self.finished()
                    evaluating = (bool(cfg.eval_every) and self.step % cfg.eval_every == 0
                                  and not self.finished())
                    stop = stop_requested or (cfg.stop_at is not None and self.step >= cfg.stop_at)
                    checkpointing = self.checkpoint_due() or stop
                    full = len(self.unread) >= MAX_UNREAD_STEPS
                    if logging or evaluating or checkpointing or full:
                        self.read_steps()
                    if logging:
                        self.log(lr)
                    if evaluating:
                        self.evaluate_during_training()
                    if checkpointing:
                        self.save_checkpoint()
                        self.last_checkpoint, self.last_checkpoint_s = self.step, self.train_seconds
                        self.log_time = time.perf_counter()
                    if stop:
                        self.status = "interrupted" if stop_requested else "stopped"
                        break
        except TrainingDiverged as exc:
            raise summary.diverged(self, exc) from None
        finally:
            self.bar.close()

    def _start_loop(self) -> None:
        """The loop's own state: progress bar, signal flag, status, what is read and logged."""
        from tqdm import tqdm

        steps = self.total_steps is not None
        self.bar = tqdm(total=self.total_steps or int(self.budget_s),
                        initial=self.step if steps else int(self.train_seconds),
                        unit="step" if steps else "s", disable=True if not self.verbose else None,
                        dynamic_ncols=True, leave=False)
        self.flag: dict[str, Any] = {}  # "signal": set by stop_signals
        self.status = "finished"
        self.last_checkpoint = self.step if self.resume_from is not None else None
        self.last_checkpoint_s = self.train_seconds
        self.last_eval: dict[str, float] = {}
        # each step's (step, mean loss, gradient norm, non-finite inputs), on the device until read:
        # reading makes the host wait for the device, so it waits for when the numbers are needed
        self.unread: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.log_images, self.log_time = 0, time.perf_counter()

    def checkpoint_due(self) -> bool:
        """Every `checkpoint_every` steps, at each epoch's end, or `checkpoint_every_min` minutes of
        training after the last checkpoint (none with checkpoint_every 0). Training time is agreed
        across processes, so every process decides alike."""
        cfg = self.cfg
        if not cfg.checkpoint_every:
            return False
        since = self.train_seconds - self.last_checkpoint_s
        return (self.step % cfg.checkpoint_every == 0 or self.step % self.steps_per_epoch == 0
                or bool(cfg.checkpoint_every_min) and since >= 60 * cfg.checkpoint_every_min)

    def finished(self) -> bool:
        if self.total_steps is not None:
            return self.step >= self.total_steps
        return self.train_seconds >= self.budget_s

    # ------------------------------------------------------------------------ one step
    def train_step(self, batches, normalize) -> tuple[float, bool]:
        """One optimizer step on a global batch: accumulate the micro-batches' gradients (synced
        across processes on the last), clip, step. Its numbers stay on the device (`unread`).
        Returns the learning rate and whether any process was asked to stop."""
        cfg, env, device = self.cfg, self.env, self.device
        lr = cfg.lr * self.schedule.factor(self.step, self.train_seconds)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)  # layer-wise decay's scale
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        bad_inputs = torch.zeros((), device=device)
        for i in range(self.accum):
            images, labels = next(batches)
            x = normalize(images.to(device, non_blocking=True))
            y = labels.to(device, non_blocking=True)
            bad_inputs += (~torch.isfinite(x)).sum()  # no sync: read with the loss
            if self.inputs.mixer is not None:
                x, y = self.inputs.mixer(x, y)
            sync = i == self.accum - 1 or not env.distributed
            with contextlib.nullcontext() if sync else self.wrapped.no_sync():
                with autocast(device, self.amp_dtype):
                    loss = loss_fn(self.wrapped(x), y, cfg.label_smoothing)
                self.scaler.scale(loss / self.accum).backward()
            loss_sum += loss.detach()
        # the global batch's mean loss and count of non-finite inputs, all-reduced on the device
        shared = torch.stack([(loss_sum / self.accum).to(self.exact), bad_inputs.to(self.exact)])
        shared = distributed.all_reduce(shared, env)
        mean_loss, inputs_bad = shared[0] / env.world_size, shared[1]
        self.scaler.unscale_(self.optimizer)
        clip = cfg.clip_grad or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.ema is not None:
            self.ema.update(self.model, self.step)  # the plain module: DDP keeps every rank's alike
        self.optimizer.zero_grad(set_to_none=True)
        self.unread.append((self.step + 1, mean_loss.detach(), norm.detach(), inputs_bad.detach()))
        self.step += 1
        self.images_seen += cfg.batch_size
        self.log_images += cfg.batch_size
        # the step's host time and any stop request, agreed across processes (a time budget must
        # end every process at once); the device's queue is bounded, so host and device agree
        asked = float(bool(self.flag.get("signal")))
        step_time, stop_requested = distributed.host_max([time.perf_counter() - t0, asked], env)
        self.train_seconds += step_time
        self.bar.update(1 if self.total_steps else int(self.train_seconds) - self.bar.n)
        return lr, stop_requested > 0

    def read_steps(self) -> None:
        """Read the unread steps' losses and gradient norms (one wait for the device); stop at the
        first non-finite one, blaming the data when its normalised images were not finite."""
        if not self.unread:
            return
        exact = self.exact
        values = torch.stack([torch.stack([loss.to(exact), norm.to(exact), bad.to(exact)])
                              for _, loss, norm, bad in self.unread]).tolist()
        steps = [s for s, *_ in self.unread]
        self.unread.clear()
        for s, (loss, norm, bad_inputs) in zip(steps, values):
            if not math.isfinite(loss) and bad_inputs:
                mean, std = list(self.model.config.mean), list(self.model.config.std)
                raise TrainingDiverged(f"the loss is {loss} at step {s} because the normalised "
                                       "images hold NaN or infinite values "
                                       f"(mean {mean}, std {std})", inputs=True, step=s)
            if not math.isfinite(loss):
                raise TrainingDiverged(f"the loss is {loss} at step {s}", step=s)
            if not math.isfinite(norm) and not self.scaler.is_enabled():  # the scaler skips those
                raise TrainingDiverged(f"the gradient norm is {norm} at step {s} (loss {loss:.4g})",
                                       step=s)
        self.loss_value, self.grad_norm = values[-1][:2]

    def log(self, lr: float) -> None:
        now = time.perf_counter()
        self.metrics.write({"step": self.step, "epoch": round(self.step / self.steps_per_epoch, 4),
                            "loss": self.loss_value, "lr": lr, "grad_norm": self.grad_norm,
                            "images_per_s": self.log_images / max(now - self.log_time, 1e-9),
                            "train_seconds": round(self.train_seconds, 3)})
        self.bar.set_postfix(loss=f"{self.loss_value:.4f}", lr=f"{lr:.2e}")
        self.log_images, self.log_time = 0, now

    # ------------------------------------------------------------------------ evaluation
    def evaluate_during_training(self) -> None:
        """On the validation set when there is one (never the test set: it must not choose)."""
        val_set = self.inputs.val_set
        judged = val_set if val_set is not None else self.inputs.test_set
        prefix = "val" if val_set is not None else "eval"
        self.last_eval = self.evaluation.measure(judged)
        self.metrics.write(scores(prefix, self.last_eval, self.step))
        if val_set is not None:
            self.consider_best(self.last_eval)
        if self.ema_evaluation is not None:  # the EMA weights on the same images
            ema = self.ema_evaluation.measure(judged)
            self.metrics.write(scores("ema_" + prefix, ema, self.step))
        self.log_time = time.perf_counter()

    def consider_best(self, result: dict[str, float]) -> None:
        # only a strictly better top-1 replaces the best (ties: the earliest); every rank compares
        # the same all-reduced sums, so all ranks agree
        best = self.best
        if self.cfg.keep_best and (best["step"] is None or result["top1"] > best["val_top1"]):
            best.update(step=self.step, val_top1=result["top1"],
                        weights=checkpoint.host_copy(self.model))

    def final_evaluation(self) -> tuple[dict[str, float], dict[str, float]]:
        """A finished run: the last checkpoint, then the (test, validation) scores of the final
        weights, the best ones with keep_best. The test set is measured once."""
        val_set, test_set = self.inputs.val_set, self.inputs.test_set
        if self.run_dir is not None and self.last_checkpoint != self.step:
            self.save_checkpoint()
        val_final = self.evaluation.measure(val_set) if val_set is not None else {}
        self.consider_best(val_final)  # the last step is an evaluation point too
        if self.cfg.keep_best and self.best["step"] != self.step:
            self.model.load_state_dict(self.best["weights"])  # test, few-shot, saved: the best
        final = self.evaluation.measure(test_set)
        line = scores("val", val_final, self.step) if val_set is not None else scores(
            "eval", final, self.step)
        self.metrics.write(line, tensorboard=False)
        if self.ema_evaluation is not None:  # the EMA's scores beside the raw weights'
            self.ema_final = self.ema_evaluation.measure(test_set)
            if val_set is not None:
                self.ema_val_final = self.ema_evaluation.measure(val_set)
            line = (scores("ema_val", self.ema_val_final, self.step) if val_set is not None
                    else scores("ema_eval", self.ema_final, self.step))
            self.metrics.write(line, tensorboard=False)
        return final, val_final

    def partial_results(self) -> tuple[dict[str, float], dict[str, float]]:
        """A stopped run: the last evaluation stands for the test scores (not a validation one)."""
        return (self.last_eval if self.inputs.val_set is None else {}), {}

    # ------------------------------------------------------------------------ checkpoint
    def save_checkpoint(self) -> None:
        """Every rank's random state; rank 0 writes, then every rank waits for it."""
        rng = distributed.gather_objects(checkpoint.rng_state(self.env.device), self.env)
        if self.env.is_main and self.run_dir is not None:
            saving = {"step": self.step, "epoch": self.step // self.steps_per_epoch,
                      "batch_in_epoch": self.step % self.steps_per_epoch,
                      "train_seconds": self.train_seconds, "images_seen": self.images_seen,
                      "world_size": self.env.world_size, "loss": self.loss_value,
                      "grad_norm": self.grad_norm, "optimizer": self.optimizer.state_dict(),
                      "schedule": self.schedule.state_dict(), "scaler": self.scaler.state_dict(),
                      "rng": rng, "precision": flag(self.amp_dtype)}
            if self.cfg.keep_best:
                saving["best"] = dict(self.best)
            checkpoint.save(self.run_dir / "checkpoints", self.step, self.model, saving,
                            self.cfg.keep_checkpoints,
                            ema=self.ema.module if self.ema is not None else None)
        distributed.barrier(self.env)
