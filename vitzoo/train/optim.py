"""The optimizer and what moves with it: parameter groups, the learning-rate schedule, the EMA.

Weight decay skips biases, norms, the class token and position embeddings (`no_weight_decay`).
Layer-wise decay R gives each parameter a depth (the embedding 0, block i i + 1, the final norm the
last block's, the head the top) and the rate R ** (top - depth): timm's `create_optimizer_v2(model,
layer_decay=R)` groups. The schedule warms up linearly, then decays linearly, by a cosine or not at
all, over steps or over the seconds of a time budget. The EMA is ema = decay * ema + (1 - decay) *
weights after each step, with `warmup` update t's decay is min(decay, (1 + t) / (10 + t)).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import torch

from vitzoo.errors import ConfigError

EMA_WEIGHTS_NAME = "model_ema.safetensors"


def parameter_groups(model: torch.nn.Module, weight_decay: float,
                     layer_decay: float | None = None) -> list[dict[str, Any]]:
    """Matrices (weight decay) and the rest; with `layer_decay`, one group per depth and decay,
    each with its "lr_scale"."""
    skip = model.no_weight_decay()
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def decays(name: str, p: torch.nn.Parameter) -> bool:
        return p.ndim > 1 and name not in skip

    if layer_decay is None:
        return [{"params": [p for n, p in trainable if decays(n, p)], "weight_decay": weight_decay},
                {"params": [p for n, p in trainable if not decays(n, p)], "weight_decay": 0.0}]
    matcher = model.group_matcher(coarse=True)
    stem, block = re.compile(matcher["stem"]), re.compile(matcher["blocks"])
    last = len(model.encoder.blocks)

    def depth(name: str) -> int:
        if stem.match(name):
            return 0
        if found := block.match(name):
            return int(found.group(1)) + 1
        return last if name.startswith("encoder.norm") else last + 1  # the norm: the last block's

    depths = {name: depth(name) for name, _ in trainable}
    top = max(depths.values())
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, p in trainable:
        key = (depths[name], decays(name, p))
        groups.setdefault(key, {"params": [], "weight_decay": weight_decay if key[1] else 0.0,
                                "lr_scale": layer_decay ** (top - key[0])})["params"].append(p)
    return list(groups.values())


def build_optimizer(cfg, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """AdamW or SGD over `parameter_groups`, fused where the device has the kernels."""
    groups = parameter_groups(model, cfg.weight_decay, cfg.layer_decay)
    fused = {"fused": True} if device.type in ("cuda", "cpu") else {}
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **fused)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **fused)


def decay(kind: str, q: float) -> float:
    q = min(max(q, 0.0), 1.0)
    return {"linear": 1.0 - q, "cosine": 0.5 * (1.0 + math.cos(math.pi * q))}.get(kind, 1.0)


@dataclass
class Schedule:
    """The lr factor of update s (from 0): (s + 1) / W in W warm-up steps, then
    decay((s - W) / (total - W)); with a time budget the decay follows the training seconds."""

    kind: str  # linear | cosine | constant
    warmup: float  # steps (>= 1), or a fraction of the run (< 1)
    total_steps: int | None = None  # a run of steps
    budget_s: float | None = None  # a run of seconds
    warmup_end_s: float | None = None  # a run of seconds: when its warm-up in steps ended

    def __post_init__(self) -> None:
        if self.total_steps is not None:
            whole = self.warmup >= 1
            self.warmup_steps = int(self.warmup) if whole else round(self.warmup * self.total_steps)
            if self.warmup_steps >= self.total_steps:
                raise ValueError(f"a warm-up of {self.warmup_steps} steps does not fit a run of "
                                 f"{self.total_steps} steps; lower --warmup")

    def factor(self, step: int, elapsed_s: float = 0.0) -> float:
        """The multiplier of the peak lr for update `step`."""
        if self.total_steps is not None:
            w = self.warmup_steps
            if step < w:
                return (step + 1) / w
            return decay(self.kind, (step - w) / (self.total_steps - w))
        if self.warmup >= 1:  # a warm-up in steps, then a decay over the rest of the budget
            if step < self.warmup:
                return (step + 1) / self.warmup
            if self.warmup_end_s is None:
                self.warmup_end_s = elapsed_s
            start = self.warmup_end_s
        else:
            start = self.warmup * self.budget_s
            if elapsed_s < start:
                return max(elapsed_s / start, 1.0 / 1000)
        return decay(self.kind, (elapsed_s - start) / max(self.budget_s - start, 1e-9))

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.warmup_end_s = state["warmup_end_s"]


def plan_length(cfg, train_images: int) -> tuple[int, int | None, float | None, Schedule]:
    """(steps per epoch, total steps or None, the time budget in seconds or None, the schedule)."""
    steps_per_epoch = train_images // cfg.batch_size
    if steps_per_epoch == 0:
        held = f", val_size={cfg.val_size} held out" if cfg.val_size else ""
        raise ConfigError(f"batch_size={cfg.batch_size} is larger than the training set "
                          f"({train_images} images{held}): lower --batch-size"
                          + (" or --val-size" if held else ""))
    total_steps = cfg.steps
    if cfg.epochs is not None:
        total_steps = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    budget_s = cfg.time_budget_min * 60 if cfg.time_budget_min is not None else None
    warmup = cfg.warmup if cfg.warmup is not None else cfg.recipe_warmup(total_steps)
    return (steps_per_epoch, total_steps, budget_s,
            Schedule(cfg.schedule, warmup, total_steps=total_steps, budget_s=budget_s))


class ModelEMA:
    """`module`: a copy of the model (eval mode, no gradients) that `update` moves towards it."""

    def __init__(self, model: torch.nn.Module, decay: float, warmup: bool = False) -> None:
        self.decay, self.warmup = decay, warmup
        self.module = copy.deepcopy(model).eval().requires_grad_(False)

    def decay_at(self, updates: int) -> float:
        return min(self.decay, (1 + updates) / (10 + updates)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: torch.nn.Module, updates: int) -> None:
        """Move towards `model`'s weights; `updates`: how many updates came before this one."""
        weights = model.state_dict()
        mine, theirs = [], []
        for name, e in self.module.state_dict().items():
            if e.is_floating_point():
                mine.append(e)
                theirs.append(weights[name].detach())
            else:
                e.copy_(weights[name])  # an integer buffer is the model's own
        if mine:
            torch._foreach_lerp_(mine, theirs, 1.0 - self.decay_at(updates))
