"""Inference in the precision a device computes fastest: `for_inference(model)` casts the weights
once (autocast would cast them at every call), chooses the attention kernel of that precision and,
if asked, compiles the model with frozen weights (Inductor folds them into the graph).
`compile_for_inference` and `compile_for_training` are the compiled paths the benchmarks time.
"""

from __future__ import annotations

import torch
from torch import nn

from vitzoo.model import choose_attention
from vitzoo.precision import NAMES, SPELLINGS, Choice, autocast, fastest


def _frozen_call(model: nn.Module, x: torch.Tensor, mixed: torch.dtype | None = None):
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True), torch.inference_mode(), autocast(x.device, mixed):
        return model(x)


def compile_for_inference(model: nn.Module, example: torch.Tensor,
                          autocast: torch.dtype | None = None, mode: str | None = None):
    """The model compiled for inference with frozen weights, warmed up on `example`; call it under
    `torch.inference_mode()` (and the same autocast dtype). Other input shapes compile again."""
    compiled = torch.compile(model.eval(), mode=mode, dynamic=False)
    _frozen_call(compiled, example, autocast)
    return compiled


def compile_for_training(model: nn.Module, mode: str | None = None) -> nn.Module:
    """The model compiled (forward and backward) for training; its parameters are `model`'s."""
    return torch.compile(model, mode=mode, dynamic=False)


class Inference(nn.Module):
    """A model cast to `choice.dtype` once: images are cast to it, calls run without autograd."""

    def __init__(self, model: nn.Module, choice: Choice, compiled: bool) -> None:
        super().__init__()
        self.model, self.choice, self.dtype, self.compiled = model, choice, choice.dtype, compiled

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.to(self.dtype)
        if self.compiled:
            return _frozen_call(self.model, x)
        with torch.inference_mode():
            return self.model(x)

    def describe(self) -> str:
        """The precision, why, and whether compiled: "bfloat16: the CPU has amx_bf16; eager"."""
        return f"{self.choice}; {'compiled' if self.compiled else 'eager'}"


def for_inference(model: nn.Module, precision: torch.dtype | str = "auto",
                  compile: bool = False) -> Inference:
    """`model` for inference, converted in place (eval mode, parameters frozen and cast: deepcopy
    it first to keep it). `precision`: "auto", what its device computes fastest, or a dtype or
    its name (float32/fp32, bfloat16/bf16, float16/fp16). `compile=True` compiles it with frozen
    weights at the first call (each new input shape again)."""
    device = next(model.parameters(), torch.empty(0)).device
    if precision == "auto":
        choice = fastest(device)
    else:
        dtype = SPELLINGS.get(precision) if isinstance(precision, str) else precision
        if not isinstance(dtype, torch.dtype) or dtype not in NAMES:
            raise ValueError(f"precision={precision!r}: use 'auto' or one of "
                             + ", ".join(SPELLINGS))
        choice = Choice(dtype, "asked for")
    model = model.eval().requires_grad_(False).to(choice.dtype)
    choose_attention(model, device, choice.dtype)
    if compile:
        model.compile(dynamic=False)  # in place: the state dict keeps its keys
    return Inference(model, choice, compile)


__all__ = ["Inference", "compile_for_inference", "compile_for_training", "for_inference"]
