"""The arithmetic and wiring of a run's set-up, apart from the `Trainer` that reads top to bottom: how
a global batch splits into processes and micro-batches, how long the run is and the learning-rate
schedule over that length, and the model as the loop calls it (across processes, compiled).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from vitzoo.errors import ConfigError
from vitzoo.train.build import has_running_statistics
from vitzoo.train.config import TrainConfig
from vitzoo.train.distributed import Env
from vitzoo.train.schedule import Schedule


def batch_split(cfg: TrainConfig, world_size: int) -> tuple[int, int]:
    """(micro, accum): each of `world_size` processes computes its share of the global batch as `accum`
    micro-batches of `micro` images, so that the global batch is `batch_size` whatever the processes."""
    micro = cfg.micro_batch or cfg.batch_size // world_size
    if micro < 1 or cfg.batch_size % (world_size * micro):
        raise ConfigError(f"batch_size={cfg.batch_size} is not a multiple of world_size={world_size} x "
                          f"micro_batch={micro}")
    return micro, cfg.batch_size // (world_size * micro)


class Length(NamedTuple):
    """How long a run is (`total_steps`, or a time budget of `budget_s` seconds of training when it is
    None) and the learning-rate schedule over that length."""

    steps_per_epoch: int
    total_steps: int | None
    budget_s: float | None
    schedule: Schedule


def plan_length(cfg: TrainConfig, train_images: int) -> Length:
    """The run's length from `steps`, `epochs` or `time_budget_min`, over a training set of `train_images`."""
    steps_per_epoch = train_images // cfg.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size={cfg.batch_size} is larger than the training set ({train_images} images)")
    total_steps = None
    if cfg.steps is not None:
        total_steps = cfg.steps
    elif cfg.epochs is not None:
        total_steps = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    budget_s = cfg.time_budget_min * 60 if cfg.time_budget_min is not None else None
    warmup = cfg.warmup if cfg.warmup is not None else cfg.recipe_warmup(total_steps)
    return Length(steps_per_epoch, total_steps, budget_s,
                  Schedule(cfg.schedule, warmup, total_steps=total_steps, budget_s=budget_s))


def distribute(model: torch.nn.Module, cfg: TrainConfig, env: Env) -> torch.nn.Module:
    """What the loop calls: `model` in DDP across processes, compiled, as asked; `model` itself is what
    is evaluated and saved. On CUDA, matrix products in TF32."""
    device = env.device
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    wrapped = model
    if env.distributed:
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                            broadcast_buffers=has_running_statistics(model))
    if cfg.compile:
        wrapped = torch.compile(wrapped)
    return wrapped
