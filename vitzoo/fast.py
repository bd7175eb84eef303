"""Fast paths that compute what the plain model computes, only faster.

The eager model is already lean (one fused q/k/v projection, the attention kernel that is fastest for
the device and precision, the last block computed for the pooled class token alone, weight
standardization computed once in eval mode). Two things remain:

- Under bf16 autocast every matrix product casts its float32 weight to bf16 at every call (a ViT-B/16
  forward casts 86M weights each time). `for_inference` casts the weights once, in place: to bf16, or
  fp16 on GPUs that only emulate bf16 (T4, V100), by default.
- Eager PyTorch cannot fuse the element-wise work around the matrix products or lay the weights out
  for the CPU's matrix kernels ahead of time; torch.compile (Inductor) does both.

- `for_inference`: the model with its weights in bf16 or fp16 (or float32), optionally compiled as below.
- `compile_for_inference`: Inductor with weight *freezing*: parameters become constants, folded and
  pre-packed for oneDNN on CPU (cuBLAS-friendly on CUDA), bias/GELU/residual adds fused. The model
  must not be trained afterwards through the returned module (the weights are baked in).
- `compile_for_training`: Inductor for the forward and backward passes (a ViT-S/16 bf16 step on the
  CPU: 1.29-1.30x timm's eager step at 0.95x its peak tensor memory). `model.set_attention_probabilities_stored()`
  keeps the attention's T x T probabilities instead of recomputing them (+10% memory there, 0.5-3%
  faster in our runs).

Compilation happens at the first call (tens of seconds on a small CPU); `example` triggers it at once.
"""

from __future__ import annotations

import torch
from torch import nn

from vitzoo import precision


def compile_for_inference(
    model: nn.Module, example: torch.Tensor, autocast: torch.dtype | None = None, mode: str | None = None
) -> nn.Module:
    """The model compiled for inference with frozen weights, warmed up on `example`.

    Call the result under `torch.inference_mode()` (and the same autocast dtype) as you would the
    model. Input shapes other than the example's trigger a recompilation.
    """
    import torch._inductor.config as inductor_config

    model.eval()
    compiled = torch.compile(model, mode=mode, dynamic=False)
    # freezing is read when the graph is compiled, i.e. at the first call: warm up inside the patch
    with inductor_config.patch(freezing=True), torch.inference_mode(), precision.autocast(example.device, autocast):
        compiled(example)
    return compiled


class Inference(nn.Module):
    """A model whose weights were cast to `dtype` once: images of any floating dtype are cast to it
    (others are refused by the model's own input check), and every call runs without autograd.
    Outputs are in `dtype`."""

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # only floats are cast: anything else goes to the model as it is, whose input check refuses it
        # (integer or boolean images are not normalised pixels; a cast would hide that)
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.to(self.dtype)
        with torch.inference_mode():
            return self.model(x)


INFERENCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def inference_dtype(device: torch.device | str) -> torch.dtype:
    """The half precision to infer in on `device`: bf16, except fp16 on a GPU that only emulates bf16
    (T4, V100: emulated bf16 is several times slower than their fp16)."""
    device = torch.device(device)
    if device.type == "cuda" and not precision.native_bf16(device):
        return torch.float16
    return torch.bfloat16


def for_inference(model: nn.Module, dtype: torch.dtype | None = None, compile: bool = False,
                  example: torch.Tensor | None = None, mode: str | None = None) -> Inference:
    """`model` for inference in `dtype`, its weights cast once; compiled with frozen weights if asked.
    `dtype` None: `inference_dtype` of the model's device (bf16, fp16 on GPUs without native bf16).

    The model is converted in place, as `model.to(dtype)` does: put in eval mode, its parameters frozen
    (requires_grad False) and cast, so that the bf16 weights replace the float32 ones instead of
    sitting beside them (half the memory of the weights). `copy.deepcopy(model)` first to keep the
    float32 model. Every tensor runs in `dtype`, the residual stream included; under autocast it
    would stay in float32, so bf16 outputs differ from autocast's within bf16's rounding.

    `compile=True` compiles with Inductor and frozen weights (see `compile_for_inference`) and needs
    `example`, a batch of the shape that will be used, to compile at once.
    """
    if dtype is None:
        dtype = inference_dtype(next(model.parameters(), torch.empty(0)).device)
    if dtype not in INFERENCE_DTYPES:
        raise ValueError(f"dtype must be one of {INFERENCE_DTYPES}, got {dtype}")
    if compile and example is None:
        raise ValueError("compile=True needs `example`, a batch of the inputs' shape, to compile with frozen weights")
    fast = Inference(model.eval().requires_grad_(False).to(dtype), dtype)
    if compile:
        import torch._inductor.config as inductor_config

        # in place (nn.Module.compile): the state dict keeps the model's keys
        fast.model.compile(mode=mode, dynamic=False)
        with inductor_config.patch(freezing=True):  # read when the graph is compiled: at this first call
            fast(example)
    return fast


def compile_for_training(model: nn.Module, mode: str | None = None) -> nn.Module:
    """The model compiled (forward and backward) for training; parameters stay shared with `model`."""
    return torch.compile(model, mode=mode, dynamic=False)
