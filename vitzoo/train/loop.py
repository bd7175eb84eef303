"""`fit(TrainConfig)`: the training loop, top to bottom, as a `Trainer`.

`Trainer.__init__` checks what is cheap first, then builds the splits, the model, the optimizer and
the schedule, and loads the last checkpoint when resuming. Each `train_step` accumulates the
micro-batches' gradients, clips and steps; its loss stays on the device until a log, evaluation or
checkpoint reads it (`read_steps`, which stops at a non-finite one). A stop signal ends the loop
with a checkpoint; then the final evaluation, the saved model and summary.json.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
import warnings
from typing import Any

import torch
import torch.nn.functional as F

import vitzoo
from vitzoo import data as datasets
from vitzoo.errors import ConfigError, TrainingDiverged
from vitzoo.io import write_text
from vitzoo.model import choose_attention
from vitzoo.precision import autocast, flag, sum_dtype, training_dtype
from vitzoo.train import checkpoint, distributed, inputs, report
from vitzoo.train.config import TrainConfig
from vitzoo.train.optim import ModelEMA, build_optimizer, plan_length
from vitzoo.train.report import Metrics, scores
from vitzoo.weights.layout import HUB_PREFIX

MAX_UNREAD_STEPS = 100  # steps whose loss may wait on the device before it is read and checked


def loss_fn(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """Cross-entropy in float32; `targets`: class indices or (MixUp, CutMix) probabilities."""
    return F.cross_entropy(logits.float(), targets, label_smoothing=label_smoothing)


def fit(config: TrainConfig) -> dict[str, Any]:
    """Train as `config` says; the summary (also RUN/summary.json). For the model as well:
    `trainer = Trainer.from_config(config)`, `trainer.run()`, `trainer.model`."""
    return Trainer.from_config(config).run()


def resolve_model(cfg: TrainConfig) -> vitzoo.Resolved:
    """The model a run trains, worked out once with the user's options: the named one, with the
    weights `pretrained` names (a tag or a Hub repo decides the model, as a saved one does)."""
    options = {k: v for k, v in cfg.model_options.items() if k != "num_classes"}  # the data's
    source = cfg.pretrained or ""
    named = source.startswith(HUB_PREFIX) or source.split("@")[0] in vitzoo.list_pretrained()
    return vitzoo.resolve(source if named else cfg.model, pretrained=named or cfg.pretrained,
                          **options)


class Trainer:
    """One run: `Trainer(cfg, env)` sets it up; `run()` trains, evaluates, saves, and returns
    the summary."""

    @classmethod
    def from_config(cls, config: TrainConfig) -> Trainer:
        """The run of `config`, its recipe resolved, in this process (torchrun's, or alone)."""
        cfg = config.resolved()
        return cls(cfg, distributed.setup(cfg.device))

    def __init__(self, cfg: TrainConfig, env: distributed.Env) -> None:
        self.cfg, self.env, self.device = cfg, env, env.device
        self.wall_start = time.perf_counter()
        self.verbose = env.is_main and not cfg.quiet
        inputs.check_data(cfg, env)  # with --download, the first process fetches the files
        self.run_dir = checkpoint.prepare_run_dir(cfg)
        distributed.barrier(env)  # every rank has checked the run directory before rank 0 writes
        self.micro, self.accum = cfg.batch_split(env.world_size)
        resolved = resolve_model(cfg)
        *splits, info = inputs.load_splits(cfg, resolved.config)
        torch.manual_seed(cfg.seed)  # the same initial weights on every process
        self.model = self.build_model(resolved, info).to(self.device)
        self.amp_dtype = training_dtype(cfg.precision, self.device)
        self.inputs = inputs.Inputs(cfg, env, self.model.config.img_size, splits,
                                    info.num_classes, self.micro)
        self.steps_per_epoch, self.total_steps, self.budget_s, self.schedule = plan_length(
            cfg, len(self.inputs.train_set))
        self.optimizer = build_optimizer(cfg, self.model, self.device)
        # from the weights training starts from (a resume loads its own)
        self.ema = (ModelEMA(self.model, cfg.model_ema_decay, cfg.model_ema_warmup)
                    if cfg.model_ema else None)
        span = 1 / (1 - cfg.model_ema_decay)
        if self.ema and not cfg.model_ema_warmup and span > (self.total_steps or math.inf):
            warnings.warn(f"model_ema_decay={cfg.model_ema_decay} averages about the last "
                          f"{span:.0f} steps, more than this run's {self.total_steps}: lower "
                          "--model-ema-decay (0.99) or add --model-ema-warmup", stacklevel=2)
        self.resume()
        for model in (self.model, self.ema and self.ema.module):  # the kernel of its precision
            if model is not None:
                choose_attention(model, self.device, self.amp_dtype)
        if self.run_dir is not None and env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_text(self.run_dir / "train_config.json", cfg.to_json())
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        self.wrapped = self.model  # what trains; `model` is evaluated and saved
        if env.distributed:  # buffers broadcast for BatchNorm statistics only (vitzoo's are fixed)
            moving = any(getattr(m, "running_mean", None) is not None for m in self.model.modules())
            self.wrapped = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                broadcast_buffers=moving)
        if cfg.compile:
            self.wrapped = torch.compile(self.wrapped)

    def build_model(self, resolved: vitzoo.Resolved, info: datasets.DataInfo) -> torch.nn.Module:
        """The model with the data's classes; from scratch its channels and normalisation too."""
        cfg, given = self.cfg, self.cfg.model_options
        if given.get("num_classes", info.num_classes) != info.num_classes:
            raise ConfigError(f"num_classes={given['num_classes']} but {cfg.data} has "
                              f"{info.num_classes} classes")
        changes: dict[str, Any] = {"num_classes": info.num_classes}
        if not cfg.pretrained:
            in_chans = changes["in_chans"] = given.get("in_chans", info.in_chans)
            for key in ("mean", "std"):
                value = tuple(getattr(info, key))
                changes[key] = given.get(key, value * in_chans if len(value) == 1 else value)
        model = resolved.build(resolved.config.replace(**changes))
        if cfg.reset_head:
            model.reset_classifier(info.num_classes, head="linear")  # zero-initialised
        model.set_grad_checkpointing(cfg.grad_checkpointing)
        if info.classes is not None:
            model.labels = list(info.classes)
        return model

    def say(self, message: str) -> None:
        if self.verbose:
            print(message, file=sys.stderr, flush=True)

    def resume(self) -> None:
        """The state the last checkpoint holds, or a fresh one."""
        cfg, env, device = self.cfg, self.env, self.device
        self.step, self.train_seconds, self.images_seen = 0, 0.0, 0
        self.loss_value = self.grad_norm = None  # the last read: a run resumed at its end has them
        self.best: dict[str, Any] = {"step": None, "val_top1": None, "weights": None}
        self.resume_from = checkpoint.latest(self.run_dir / "checkpoints") if cfg.resume else None
        if self.resume_from is None:
            if cfg.resume and env.is_main:  # said quiet or not
                print(f"no checkpoint in {self.run_dir}: starting from step 0", file=sys.stderr)
            torch.manual_seed(cfg.seed + 1 + env.rank)  # dropout, drop-path, mixing: per rank
            self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp_dtype == torch.float16)
            return
        saved = checkpoint.load(self.resume_from, self.model, device, self.ema and self.ema.module)
        self.amp_dtype = training_dtype(saved["precision"], device)  # a run keeps its precision
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp_dtype == torch.float16)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.schedule.load_state_dict(saved["schedule"])
        self.scaler.load_state_dict(saved["scaler"])
        self.step, self.train_seconds = saved["step"], saved["train_seconds"]
        self.images_seen, self.loss_value, self.grad_norm = (saved["images_seen"], saved["loss"],
                                                             saved["grad_norm"])
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
        self.flag: dict[str, Any] = {}  # "signal": set by stop_signals
        self.status, self.last_eval = "finished", {}
        self.ema_final: dict[str, float] = {}
        self.ema_val_final: dict[str, float] = {}
        try:
            self.train()
            final, val_final = self.final_evaluation() if self.status == "finished" else (
                self.last_eval if self.inputs.val_set is None else {}, {})
        finally:
            self.metrics.close()
        return report.finish(self, final, val_final)

    def train(self) -> None:
        """Steps until the run's end, `stop_at` or a signal; logs, evaluations, checkpoints."""
        from tqdm import tqdm

        cfg, config = self.cfg, self.model.config
        steps = self.total_steps is not None
        self.bar = tqdm(total=self.total_steps or int(self.budget_s), unit="step" if steps else "s",
                        initial=self.step if steps else int(self.train_seconds),
                        disable=None if self.verbose else True, dynamic_ncols=True, leave=False)
        self.last_checkpoint = self.step if self.resume_from is not None else None
        self.last_checkpoint_s = self.train_seconds
        # each step's (step, loss, gradient norm, non-finite inputs), on the device until read:
        # reading makes the host wait for the device, so it waits for when they are needed
        self.unread: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.log_images, self.log_time = 0, time.perf_counter()
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
                        self.log_time = time.perf_counter()
                    if stop:
                        self.status = "interrupted" if stop_requested else "stopped"
                        break
        except TrainingDiverged as exc:
            raise report.diverged(self, exc) from None
        finally:
            self.bar.close()

    def checkpoint_due(self) -> bool:
        """Every `checkpoint_every` steps, at each epoch's end, or `checkpoint_every_min` minutes of
        training after the last (agreed time: every process decides alike)."""
        cfg = self.cfg
        since = self.train_seconds - self.last_checkpoint_s
        return bool(cfg.checkpoint_every) and (
            self.step % cfg.checkpoint_every == 0 or self.step % self.steps_per_epoch == 0
            or bool(cfg.checkpoint_every_min) and since >= 60 * cfg.checkpoint_every_min)

    def finished(self) -> bool:
        if self.total_steps is not None:
            return self.step >= self.total_steps
        return self.train_seconds >= self.budget_s

    def train_step(self, batches, normalize) -> tuple[float, bool]:
        """One optimizer step on a global batch (gradients synced on its last micro-batch); the
        learning rate, and whether any process was asked to stop."""
        cfg, env, device = self.cfg, self.env, self.device
        exact = sum_dtype(device)  # of the loss and clock reductions
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
        shared = torch.stack([(loss_sum / self.accum).to(exact), bad_inputs.to(exact)])
        shared = distributed.all_reduce(shared, env)
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad or math.inf)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.ema is not None:
            self.ema.update(self.model, self.step)  # the plain module: DDP keeps every rank's alike
        self.optimizer.zero_grad(set_to_none=True)
        self.unread.append((self.step + 1, shared[0] / env.world_size, norm.detach(), shared[1]))
        self.step += 1
        self.images_seen += cfg.batch_size
        self.log_images += cfg.batch_size
        # the step's time and any stop request, agreed (a time budget ends every process at once)
        asked = float(bool(self.flag.get("signal")))
        step_time, stop_requested = distributed.host_max([time.perf_counter() - t0, asked], env)
        self.train_seconds += step_time
        self.bar.update(1 if self.total_steps else int(self.train_seconds) - self.bar.n)
        return lr, stop_requested > 0

    def read_steps(self) -> None:
        """The unread steps' losses, in one wait for the device; a non-finite one stops the run,
        blaming the data when its normalised images were not finite."""
        if not self.unread:
            return
        exact = sum_dtype(self.device)
        values = torch.stack([torch.stack([loss.to(exact), norm.to(exact), bad.to(exact)])
                              for _, loss, norm, bad in self.unread]).tolist()
        steps = [s for s, *_ in self.unread]
        self.unread.clear()
        for s, (loss, norm, bad_inputs) in zip(steps, values):
            if not math.isfinite(loss) and bad_inputs:
                config = self.model.config
                raise TrainingDiverged(f"the loss is {loss} at step {s} because the normalised "
                                       f"images hold NaN or infinite values (mean "
                                       f"{list(config.mean)}, std {list(config.std)})",
                                       inputs=True, step=s)
            if not math.isfinite(loss):
                raise TrainingDiverged(f"the loss is {loss} at step {s}", step=s)
            if not math.isfinite(norm) and not self.scaler.is_enabled():  # the scaler skips those
                raise TrainingDiverged(f"the gradient norm is {norm} at step {s}", step=s)
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
    def measure(self, dataset, ema: bool = False) -> dict[str, float]:
        model = self.ema.module if ema else self.model
        return inputs.measure(model, dataset, self.env, self.amp_dtype, self.inputs.eval_batches)

    def evaluate_during_training(self) -> None:
        """On the validation set when there is one (the test set must not choose)."""
        val_set = self.inputs.val_set
        judged, prefix = (val_set, "val") if val_set is not None else (self.inputs.test_set, "eval")
        self.last_eval = self.measure(judged)
        self.metrics.write(scores(prefix, self.last_eval, self.step))
        if val_set is not None:
            self.consider_best(self.last_eval)
        if self.ema is not None:
            self.metrics.write(scores("ema_" + prefix, self.measure(judged, ema=True), self.step))
        self.log_time = time.perf_counter()

    def consider_best(self, result: dict[str, float]) -> None:
        # a strictly better top-1 only (ties: the earliest); all-reduced sums: every rank agrees
        best = self.best
        if self.cfg.keep_best and (best["step"] is None or result["top1"] > best["val_top1"]):
            best.update(step=self.step, val_top1=result["top1"],
                        weights=checkpoint.host_copy(self.model))

    def final_evaluation(self) -> tuple[dict[str, float], dict[str, float]]:
        """The last checkpoint; the (test, validation) scores of the final (or best) weights."""
        val_set, test_set = self.inputs.val_set, self.inputs.test_set
        if self.run_dir is not None and self.last_checkpoint != self.step:
            self.save_checkpoint()
        val_final = self.measure(val_set) if val_set is not None else {}
        self.consider_best(val_final)  # the last step is an evaluation point too
        if self.cfg.keep_best and self.best["step"] != self.step:
            self.model.load_state_dict(self.best["weights"])  # test, few-shot, saved: the best
        final = self.measure(test_set)
        prefix = "val" if val_set is not None else "eval"
        self.metrics.write(scores(prefix, val_final or final, self.step), tensorboard=False)
        if self.ema is not None:
            self.ema_final = self.measure(test_set, ema=True)
            self.ema_val_final = self.measure(val_set, ema=True) if val_set is not None else {}
            self.metrics.write(scores("ema_" + prefix, self.ema_val_final or self.ema_final,
                                      self.step), tensorboard=False)
        return final, val_final

    # ------------------------------------------------------------------------ files
    def save_checkpoint(self) -> None:
        """Every rank's random state; rank 0 writes, then every rank waits for it."""
        rng = distributed.gather_objects(checkpoint.rng_state(self.device), self.env)
        if self.env.is_main and self.run_dir is not None:
            state = {"step": self.step, "train_seconds": self.train_seconds,
                     "images_seen": self.images_seen, "world_size": self.env.world_size,
                     "loss": self.loss_value, "grad_norm": self.grad_norm,
                     "optimizer": self.optimizer.state_dict(), "rng": rng,
                     "schedule": self.schedule.state_dict(), "scaler": self.scaler.state_dict(),
                     "precision": flag(self.amp_dtype), "best": dict(self.best)}
            checkpoint.save(self.run_dir / "checkpoints", self.step, self.model, state,
                            self.cfg.keep_checkpoints, self.ema and self.ema.module)
        distributed.barrier(self.env)
        self.last_checkpoint, self.last_checkpoint_s = self.step, self.train_seconds
