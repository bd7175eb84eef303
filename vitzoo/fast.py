"""Fast paths that compute what the plain model computes, only faster.

The eager model is already lean (one fused q/k/v projection, the attention kernel that is fastest for
the device and precision, the last block computed for the pooled class token alone, weight
standardization computed once in eval mode). Two things remain:

- Under bf16 autocast every matrix product casts its float32 weight to bf16 at every call (a ViT-B/16
  forward casts 86M weights each time). `for_inference` casts the weights once, in place, to the
  precision the device computes fastest (`vitzoo.fastest`: bf16 on GPUs that have it natively, fp16 on
  those that only emulate it (T4, V100); on a CPU float32, bf16 or fp16, measured once per machine).
- Eager PyTorch cannot fuse the element-wise work around the matrix products or lay the weights out
  for the CPU's matrix kernels ahead of time; torch.compile (Inductor) does both.

- `for_inference`: the model with its weights in its fastest precision (or one asked for), compiled as
  below if asked, or where it measures faster (`compile="auto"`).
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

import time

import torch
from torch import nn

from vitzoo import precision
from vitzoo.fastest import Choice, fastest_precision


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
    Outputs are in `dtype`. `choice` says why this precision (and whether compiled): `describe()`."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, choice: Choice | None = None) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype
        self.choice = choice or Choice(dtype, "asked for")
        self.compiled = False
        self.compile_reason = "not asked for"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # only floats are cast: anything else goes to the model as it is, whose input check refuses it
        # (integer or boolean images are not normalised pixels; a cast would hide that)
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.to(self.dtype)
        with torch.inference_mode():
            return self.model(x)

    def describe(self) -> str:
        """What this fast path computes in and why, e.g. "bfloat16: measured 206 GFLOP/s against
        float32's 42 on this CPU; compiled: 1.3x eager on the example"."""
        return f"{self.choice}; {'compiled' if self.compiled else 'eager'}: {self.compile_reason}"


INFERENCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
COMPILE_MUST_BE = 1.05  # x eager's speed on the example, for compile="auto" to keep the compiled model


def inference_dtype(device: torch.device | str) -> torch.dtype:
    """The half precision to infer in on a GPU `device`: bf16, except fp16 on a GPU that only emulates
    bf16 (T4, V100: emulated bf16 is several times slower than their fp16); bf16 elsewhere. What the
    precision of `for_inference(model)` is on a GPU; on a CPU it is measured (`vitzoo.fastest`)."""
    device = torch.device(device)
    return precision.gpu_half(device) if device.type == "cuda" else torch.bfloat16


def _seconds_per_call(fast: Inference, example: torch.Tensor, calls: int = 3) -> float:
    fast(example)  # warm-up (and the compilation, for a compiled model)
    best = float("inf")
    for _ in range(calls):
        if example.device.type == "cuda":
            torch.cuda.synchronize(example.device)
        start = time.perf_counter()
        fast(example)
        if example.device.type == "cuda":
            torch.cuda.synchronize(example.device)
        best = min(best, time.perf_counter() - start)
    return best


def for_inference(model: nn.Module, dtype: torch.dtype | str | None = None, compile: bool | str = False,
                  example: torch.Tensor | None = None, mode: str | None = None) -> Inference:
    """`model` for inference, its weights cast once to the fastest precision of its device; compiled
    with frozen weights if asked, or where it measures faster.

    `dtype`: None or "auto" picks what the device computes fastest (`vitzoo.fastest`: on a GPU bf16
    where native, else fp16; on a CPU float32, bf16 or fp16 from a one-off measurement of the model's
    MLP product, cached per machine); or float32, bfloat16, float16 as asked. The result's `describe()`
    says what was picked and why.

    The model is converted in place, as `model.to(dtype)` does: put in eval mode, its parameters frozen
    (requires_grad False) and cast, so that the half-precision weights replace the float32 ones instead
    of sitting beside them (half the memory of the weights). `copy.deepcopy(model)` first to keep the
    float32 model. Every tensor runs in `dtype`, the residual stream included; under autocast it
    would stay in float32, so bf16 outputs differ from autocast's within bf16's rounding.

    `compile=True` compiles with Inductor and frozen weights (see `compile_for_inference`) and needs
    `example`, a batch of the shape that will be used, to compile at once. `compile="auto"` times the
    eager and the compiled model on `example` and keeps the compiled one only where it is
    `COMPILE_MUST_BE` x faster (the compilation itself takes tens of seconds on a small CPU).
    """
    device = next(model.parameters(), torch.empty(0)).device
    batch = example.shape[0] if isinstance(example, torch.Tensor) and example.dim() == 4 else 8
    if dtype is None or dtype == "auto":
        choice = fastest_precision(model, device, batch=batch)
    elif dtype in INFERENCE_DTYPES:
        choice = Choice(dtype, "asked for")
    else:
        raise ValueError(f"dtype must be 'auto' or one of {INFERENCE_DTYPES}, got {dtype!r}")
    if compile not in (False, True, "auto"):
        raise ValueError(f"compile must be True, False or 'auto', got {compile!r}")
    if compile and example is None:
        raise ValueError(f"compile={compile!r} needs `example`, a batch of the inputs' shape, to compile with frozen "
                         "weights")
    fast = Inference(model.eval().requires_grad_(False).to(choice.dtype), choice.dtype, choice)
    if compile:
        import torch._inductor.config as inductor_config

        eager_s = _seconds_per_call(fast, example) if compile == "auto" else None
        # in place (nn.Module.compile): the state dict keeps the model's keys
        fast.model.compile(mode=mode, dynamic=False)
        with inductor_config.patch(freezing=True):  # read when the graph is compiled: at this first call
            fast(example)
        fast.compiled, fast.compile_reason = True, "asked for"
        if eager_s is not None:
            gain = eager_s / _seconds_per_call(fast, example)
            if gain >= COMPILE_MUST_BE:
                fast.compile_reason = f"{gain:.2f}x eager on the example"
            else:  # back to eager: nn.Module.compile keeps the compiled call here, and nothing else
                fast.model._compiled_call_impl = None
                fast.compiled, fast.compile_reason = False, f"compiled ran at {gain:.2f}x eager on the example"
    return fast


def compile_for_training(model: nn.Module, mode: str | None = None) -> nn.Module:
    """The model compiled (forward and backward) for training; parameters stay shared with `model`."""
    return torch.compile(model, mode=mode, dynamic=False)
