"""Fast paths that compute what the plain model computes, only faster.

The eager model is already lean (one fused q/k/v projection, `scaled_dot_product_attention`, weight
standardization computed once in eval mode). What eager PyTorch cannot do is fuse the element-wise
work around the matrix products or lay the weights out for the CPU's matrix kernels ahead of time;
torch.compile (Inductor) does both:

- `compile_for_inference`: Inductor with weight *freezing*: parameters become constants, folded and
  pre-packed for oneDNN on CPU (cuBLAS-friendly on CUDA), bias/GELU/residual adds fused. The model
  must not be trained afterwards through the returned module (the weights are baked in).
- `compile_for_training`: Inductor for the forward and backward passes.

Both return a module that takes and returns the same tensors as the model. Compilation happens at
the first call (tens of seconds on a small CPU); `example` triggers it at once.
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


def compile_for_training(model: nn.Module, mode: str | None = None) -> nn.Module:
    """The model compiled (forward and backward) for training; parameters stay shared with `model`."""
    return torch.compile(model, mode=mode, dynamic=False)
