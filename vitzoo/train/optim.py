"""The optimizer and what moves with it: parameter groups, the learning-rate schedule, the EMA.

Weight decay skips biases, norms, the class token and position embeddings (`no_weight_decay`).
Layer-wise decay (BEiT's, `--layer-decay R`) gives each parameter a depth: the embedding 0, block i
i + 1, the final norm that of the last block, the head the top; depth d learns at R ** (top - d)
times the rate, in the groups timm's `create_optimizer_v2(model, layer_decay=R)` makes, each with
its "lr_scale". The schedule warms up linearly, then decays linearly or by a cosine to zero (or
stays constant), over steps or, with a time budget, over training seconds. The EMA
(`--model-ema`) is ema = decay * ema + (1 - decay) * weights after each step, of the plain module
(DDP keeps every process's replica equal); with `warmup` update t uses min(decay, (1+t) / (10+t)).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch

from vitzoo.errors import ConfigError

EMA_WEIGHTS_NAME = "model_ema.safetensors"


# ---------------------------------------------------------------------------- parameter groups
def layer_ids(model: torch.nn.Module) -> dict[str, int]:
    """Each trainable parameter's depth, by name (see the module's docstring)."""
    matcher = model.group_matcher(coarse=True)
    stem, block = re.compile(matcher["stem"]), re.compile(matcher["blocks"])
    depth = len(model.encoder.blocks)
    ids = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if stem.match(name):
            ids[name] = 0
        elif found := block.match(name):
            ids[name] = int(found.group(1)) + 1
        elif name.startswith("encoder.norm"):
            ids[name] = depth  # with the last block, as timm groups it
        else:
            ids[name] = depth + 1
    return ids


def parameter_groups(model: torch.nn.Module, weight_decay: float,
                     layer_decay: float | None = None) -> list[dict[str, Any]]:
    """Without `layer_decay`, matrices (weight decay) and the rest (none); with it, one group per
    depth and decay, each with its "lr_scale" (the top depth's 1)."""
    skip = model.no_weight_decay()

    def decays(name: str, p: torch.nn.Parameter) -> bool:
        return p.ndim > 1 and name not in skip

    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if layer_decay is None:
        return [{"params": [p for n, p in trainable if decays(n, p)], "weight_decay": weight_decay},
                {"params": [p for n, p in trainable if not decays(n, p)], "weight_decay": 0.0}]
    ids = layer_ids(model)
    top = max(ids.values())
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, p in trainable:
        key = (ids[name], decays(name, p))
        group = groups.setdefault(key, {"params": [],
                                        "weight_decay": weight_decay if key[1] else 0.0,
                                        "lr_scale": layer_decay ** (top - key[0])})
        group["params"].append(p)
    return list(groups.values())


def build_optimizer(cfg, model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    """AdamW or SGD over `parameter_groups`; fused where the device has the kernels (one pass over
    memory per step instead of a loop over parameters)."""
    groups = parameter_groups(model, cfg.weight_decay, cfg.layer_decay)
    fused = {"fused": True} if device.type in ("cuda", "cpu") else {}
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **fused)
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **fused)


# ---------------------------------------------------------------------------- schedule
def decay(kind: str, q: float) -> float:
    q = min(max(q, 0.0), 1.0)
    if kind == "linear":
        return 1.0 - q
    if kind == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * q))
    return 1.0


@dataclass
class Schedule:
    """The lr factor of update s (0-based): (s + 1) / W during W warm-up steps, then
    decay((s - W) / (total - W)). With a time budget the decay follows training seconds / budget."""

    kind: str  # linear | cosine | constant
    warmup: float  # steps (>= 1), or a fraction of the run (< 1)
    total_steps: int | None = None  # step mode
    budget_s: float | None = None  # time mode
    warmup_end_s: float | None = None  # time mode: training seconds when a warm-up in steps ended

    def __post_init__(self) -> None:
        if (self.total_steps is None) == (self.budget_s is None):
            raise ValueError("a schedule needs exactly one of total_steps and budget_s")
        if self.total_steps is not None:
            whole = self.warmup >= 1
            self.warmup_steps = int(self.warmup) if whole else round(self.warmup * self.total_steps)
            if self.warmup_steps >= self.total_steps:
                raise ValueError(f"warm-up of {self.warmup_steps} steps does not fit a run of "
                                 f"{self.total_steps} steps; lower --warmup")

    def factor(self, step: int, elapsed_s: float = 0.0) -> float:
        """Multiplier of the peak lr for the update with 0-based index `step`."""
        if self.total_steps is not None:
            w = self.warmup_steps
            if step < w:
                return (step + 1) / w
            return decay(self.kind, (step - w) / (self.total_steps - w))
        budget = self.budget_s
        if self.warmup >= 1:  # warm-up in steps, decay over the rest of the budget
            if step < self.warmup:
                return (step + 1) / self.warmup
            if self.warmup_end_s is None:
                self.warmup_end_s = elapsed_s
            start = self.warmup_end_s
        else:
            start = self.warmup * budget
            if elapsed_s < start:
                return max(elapsed_s / start, 1.0 / 1000)
        return decay(self.kind, (elapsed_s - start) / max(budget - start, 1e-9))

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.warmup_end_s = state["warmup_end_s"]


class Length(NamedTuple):
    """How long a run is (`total_steps`, or `budget_s` seconds of training when that is None) and
    the schedule over that length."""

    steps_per_epoch: int
    total_steps: int | None
    budget_s: float | None
    schedule: Schedule


def plan_length(cfg, train_images: int) -> Length:
    """The run's length from `steps`, `epochs` or `time_budget_min` over `train_images` images."""
    steps_per_epoch = train_images // cfg.batch_size
    if steps_per_epoch == 0:
        raise ConfigError(f"batch_size={cfg.batch_size} is larger than the training set "
                          f"({train_images} images)")
    total_steps = None
    if cfg.steps is not None:
        total_steps = cfg.steps
    elif cfg.epochs is not None:
        total_steps = max(1, math.ceil(cfg.epochs * steps_per_epoch))
    budget_s = cfg.time_budget_min * 60 if cfg.time_budget_min is not None else None
    warmup = cfg.warmup if cfg.warmup is not None else cfg.recipe_warmup(total_steps)
    return Length(steps_per_epoch, total_steps, budget_s,
                  Schedule(cfg.schedule, warmup, total_steps=total_steps, budget_s=budget_s))


# ---------------------------------------------------------------------------- EMA
def horizon(decay: float) -> float:
    """About how many updates the average reaches back: 1 / (1 - decay)."""
    return 1.0 / (1.0 - decay) if decay < 1 else float("inf")


class ModelEMA:
    """The moving average of `model`'s weights: `module` is a copy of the model (eval mode, no
    gradients) that `update` moves towards the model after each step."""

    def __init__(self, model: torch.nn.Module, decay: float, warmup: bool = False) -> None:
        self.decay, self.warmup = decay, warmup
        self.module = copy.deepcopy(model).eval().requires_grad_(False)

    def decay_at(self, updates: int) -> float:
        """The decay of update number `updates` (counted from 0)."""
        return min(self.decay, (1 + updates) / (10 + updates)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: torch.nn.Module, updates: int) -> None:
        """Move the average towards `model`'s weights; `updates`: the updates before this one."""
        decay = self.decay_at(updates)
        weights = model.state_dict()
        mine, theirs = [], []
        for name, e in self.module.state_dict().items():
            if e.is_floating_point():
                mine.append(e)
                theirs.append(weights[name].detach())
            else:
                e.copy_(weights[name])  # an integer buffer (an index) is the model's own
        if mine:  # ema + (1 - decay) * (weights - ema), one fused pass
            torch._foreach_lerp_(mine, theirs, 1.0 - decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def load_state_dict(self, weights: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(weights, strict=True)
