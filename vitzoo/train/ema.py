"""An exponential moving average of a model's weights (`--model-ema`), as timm users train with it.

After each optimizer step every floating-point parameter and buffer of the EMA becomes

    ema = decay * ema + (1 - decay) * weights

starting from the model's weights when training starts (after `--pretrained` loads). With `warmup`
the decay of update t (t = 0, 1, ...) is min(decay, (1 + t) / (10 + t)), TensorFlow's rule for an
average that starts from a random initialisation: the first updates follow the weights closely. The EMA
is of the plain module (not its DDP or compiled wrapper): DDP keeps every process's replica equal, so
each process's EMA is the same without communicating. It is saved beside the raw weights
(`EMA_WEIGHTS_NAME` in a run and each checkpoint), evaluated beside them, and resumed exactly.
"""

from __future__ import annotations

import copy

import torch

EMA_WEIGHTS_NAME = "model_ema.safetensors"


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
        """Move the average towards `model`'s weights; `updates`: how many updates came before this one."""
        decay = self.decay_at(updates)
        weights = model.state_dict()
        mine, theirs = [], []
        for name, e in self.module.state_dict().items():
            if e.is_floating_point():
                mine.append(e)
                theirs.append(weights[name].detach())
            else:
                e.copy_(weights[name])  # an integer buffer (an index) is the model's own
        if mine:
            # ema + (1 - decay) * (weights - ema): the formula above, one fused pass over the weights
            torch._foreach_lerp_(mine, theirs, 1.0 - decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def load_state_dict(self, weights: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(weights, strict=True)


__all__ = ["EMA_WEIGHTS_NAME", "ModelEMA", "horizon"]
