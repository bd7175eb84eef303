"""Inference paths that compute what the plain model computes, only faster (`vitzoo.inference`,
`import vitzoo` imports it; it was `vitzoo.fast`, which still imports, with a warning).

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
  below where that measured faster on this machine (the default, `compile="auto"`), or if asked.
- `compile_for_inference`: Inductor with weight *freezing*: parameters become constants, folded and
  pre-packed for oneDNN on CPU (cuBLAS-friendly on CUDA), bias/GELU/residual adds fused. The model
  must not be trained afterwards through the returned module (the weights are baked in).
- `compile_for_training`: Inductor for the forward and backward passes (a ViT-S/16 bf16 step on the
  CPU: 1.29-1.30x timm's eager step at 0.95x its peak tensor memory). `model.set_attention_probabilities_stored()`
  keeps the attention's T x T probabilities instead of recomputing them (+10% memory there, 0.5-3%
  faster in our runs).

Compilation happens at the first call (tens of seconds on a small CPU); `example` triggers it at once.
Whether it pays is measured (eager and compiled in turns, repeated: `vitzoo.compile_gain`) and kept in
$VITZOO_CACHE/compile_gain.json per machine, model, precision and input shape, only where the repeats
agree and the gain is plausible for the model's FLOPs; a kept gain is checked at each use (the compiled
model timed against eager once more) and measured again where compiled turns out slower.
`VITZOO_COMPILE=0` keeps `compile="auto"` eager without measuring (the test suite sets it: its tests do
not wait for compilations they are not about).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from vitzoo import compile_gain, measurements, precision
from vitzoo.envvars import env_choice
from vitzoo.fastest import fastest_precision
from vitzoo.measurements import measured_on
from vitzoo.precision import INFERENCE_DTYPES, Choice


def compile_for_inference(
    model: nn.Module, example: torch.Tensor, autocast: torch.dtype | None = None, mode: str | None = None
) -> nn.Module:
    """The model compiled for inference with frozen weights, warmed up on `example`.

    Call the result under `torch.inference_mode()` (and the same autocast dtype) as you would the
    model. Input shapes other than the example's trigger a recompilation.
    """
    model.eval()
    compiled = torch.compile(model, mode=mode, dynamic=False)
    _first_call_frozen(compiled, example, autocast)
    return compiled


def _first_call_frozen(compiled: Callable[[torch.Tensor], Any], example: torch.Tensor,
                       autocast: torch.dtype | None = None) -> None:
    """The first call of a compiled model, on `example`, with Inductor's weight freezing: parameters
    become constants, folded into the graph. Freezing is read when the graph compiles, at this call."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(freezing=True), torch.inference_mode(), precision.autocast(example.device, autocast):
        compiled(example)


class Inference(nn.Module):
    """A model whose weights were cast to `dtype` once: images of any floating dtype are cast to it
    (others are refused by the model's own input check), and every call runs without autograd.
    Outputs are in `dtype`. `choice` says why this precision, `describe()` also whether compiled.

    `compile` (True or "auto") is settled at the first call on floating images (or on `for_inference`'s
    example): compiled there, or for "auto" only where that measured `COMPILE_MUST_BE` x eager's speed."""

    def __init__(self, model: nn.Module, dtype: torch.dtype, choice: Choice | None = None,
                 compile: bool | str = False, mode: str | None = None) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype
        self.choice = choice or Choice(dtype, "asked for")
        self.compiled = False
        self.compile_reason = "not asked for" if not compile else "decided at the first call"
        self.pending_compile = compile  # True or "auto" until the first call settles it, then False
        self.mode = mode
        # compile="auto" watches the calls on the batch shape it settled on (`watched_call`)
        self.watch: tuple[tuple[int, ...], float] | None = None  # (shape, compiled's seconds per call then)
        self.eager_now = False  # compiled, but eager for now: it ran slower than eager at the last check
        self.calls = self.checked_at = 0
        self.switches = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # only floats are cast: anything else goes to the model as it is, whose input check refuses it
        # (integer or boolean images are not normalised pixels; a cast would hide that)
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.to(self.dtype)
            if self.pending_compile:
                self.settle_compilation(x)
            if self.watch is not None and tuple(x.shape) == self.watch[0]:
                return self.watched_call(x)
        with torch.inference_mode():
            return self.model(x)

    def watched_call(self, x: torch.Tensor) -> torch.Tensor:
        """A call of the path that is faster now, compiled or eager. The compiled model's threads wait
        for each other at every kernel; beside a busy process on a small machine that can make it slower
        than eager (0.37x on 2 cores in issue 33), and load comes and goes after compilation settled. So
        a compiled call `WATCH_SLOWER` x slower than compiled ran when settled is followed by one eager
        call on the same batch, and the faster path taken; while eager, one compiled call is tried again.
        At most one call in `RECHECK_EVERY` is such a check."""
        self.calls += 1
        out: list[torch.Tensor] = []
        name, run = ("eager", self.eager_call) if self.eager_now else ("compiled", self.model)
        with torch.inference_mode():
            took = compile_gain.timed(name, lambda batch: out.append(run(batch)), x, calls=1)
        if self.calls - self.checked_at >= RECHECK_EVERY and (self.eager_now or took > WATCH_SLOWER * self.watch[1]):
            self.checked_at = self.calls
            other_name, other = ("compiled", self.model) if self.eager_now else ("eager", self.eager_call)
            with torch.inference_mode():
                other_s = compile_gain.timed(other_name, other, x, calls=1)
            if other_s < took:
                self.eager_now = not self.eager_now
                self.switches = (f"; eager since call {self.calls}, where compiled ran at {other_s / took:.2f}x eager"
                                 if self.eager_now else f"; compiled again since call {self.calls}")
        return out[-1]

    def settle_compilation(self, example: torch.Tensor) -> None:
        """Compile on `example` (the first batch), or for "auto" keep whichever of eager and compiled
        measured faster on it: measured once per machine, model, precision and shape (cached)."""
        how, self.pending_compile = self.pending_compile, False  # the calls below run as they are
        try:
            if how is True:
                self.compile_on(example)
                self.compiled, self.compile_reason = True, "asked for"
            elif env_choice("VITZOO_COMPILE", {"0": "eager"}) == "eager":  # any other value is refused, not ignored
                self.compile_reason = "VITZOO_COMPILE=0 (not measured)"
            else:
                self.settle_by_measurement(example)
        except BaseException:  # the model refused this batch (say, its shape): the next one settles it
            self.uncompile()
            self.pending_compile = how
            raise

    def settle_by_measurement(self, example: torch.Tensor) -> None:
        """Compile where a trusted earlier measurement says it pays, checking at this use that the compiled
        model is not slower than eager (measured again where it is); measure where nothing is known."""
        key, batch = compile_key(self, example), list(example.shape)
        known = measurements.read(COMPILE_CACHE, key, valid=lambda entry: isinstance(entry, dict) and "gain" in entry)
        if known is not None and known["gain"] == 0.0:
            self.compile_reason = f"it failed to compile here before ({COMPILE_CACHE})"
        elif known is not None and known["gain"] < COMPILE_MUST_BE:
            self.compile_reason = f"compiled ran at {known['gain']:.2f}x eager on a batch of {batch} (measured before)"
        elif not self.try_compile_on(example):  # try_compile_on said why
            measurements.store(COMPILE_CACHE, key, {"gain": 0.0})
        elif known is None:
            self.decide(self.measure_gain(example, compile_gain.REPEATS), key, batch)
        else:
            check = self.measure_gain(example, compile_gain.CHECK_REPEATS)
            if check.gain >= 1.0:
                self.compiled, self.watch = True, (tuple(batch), check.compiled_s)
                self.compile_reason = (f"{known['gain']:.2f}x eager on a batch of {batch} (measured before; "
                                       f"{check.gain:.2f}x at this use)")
            else:  # slower than eager at this use: measured again, in full
                self.decide(self.measure_gain(example, compile_gain.REPEATS), key, batch,
                            f"measured again, as it ran at {check.gain:.2f}x eager at this use: ")

    def measure_gain(self, example: torch.Tensor, repeats: int) -> compile_gain.Gain:
        """The compiled model (compiled already) and eager timed in turns on `example`."""
        least_s = compile_gain.least_seconds(self.model, example, self.eager_call) if repeats > 1 else 0.0
        return compile_gain.measure(self.eager_call, self.model, example, repeats, least_s)

    def eager_call(self, x: torch.Tensor) -> torch.Tensor:
        """The model called eagerly although compiled (what `nn.Module.compile` keeps, set aside)."""
        compiled, self.model._compiled_call_impl = self.model._compiled_call_impl, None
        try:
            with torch.inference_mode():
                return self.model(x)
        finally:
            self.model._compiled_call_impl = compiled

    def decide(self, gain: compile_gain.Gain, key: str, batch: list[int], prefix: str = "") -> None:
        """Keep the compiled model where `gain` is plausible and `COMPILE_MUST_BE` x; keep the gain for the
        next process where it is trusted (and forget an earlier one where it is not)."""
        measurements.store(COMPILE_CACHE, key, gain.entry() if gain.trusted() else None)
        doubt = f"; {gain.doubt()}" if gain.doubt() else ""
        if gain.plausible() and gain.gain >= COMPILE_MUST_BE:
            self.compiled, self.watch = True, (tuple(batch), gain.compiled_s)
            self.compile_reason = f"{prefix}{gain.gain:.2f}x eager on a batch of {batch}{doubt}"
        else:
            self.uncompile()
            self.compile_reason = f"{prefix}compiled ran at {gain.gain:.2f}x eager on a batch of {batch}{doubt}"

    def compile_on(self, example: torch.Tensor) -> None:
        """Compile the model in place (`nn.Module.compile`: the state dict keeps its keys) with frozen
        weights, on `example`."""
        self.model.compile(mode=self.mode, dynamic=False)
        _first_call_frozen(self.model, example)

    def try_compile_on(self, example: torch.Tensor) -> bool:
        """`compile_on`, or eager again where this machine cannot compile (no C++ compiler, an
        unsupported operator), warning why."""
        try:
            self.compile_on(example)
            return True
        except Exception as error:  # Inductor's errors have no common base class across versions
            self.uncompile()
            self.compile_reason = f"compilation failed ({type(error).__name__}), eager"
            warnings.warn(f"vitzoo.inference: compile='auto' could not compile the model here, so it runs eagerly: "
                          f"{type(error).__name__}: {str(error)[:300]}", RuntimeWarning, stacklevel=3)
            return False

    def uncompile(self) -> None:
        # nn.Module.compile keeps the compiled call here, and nothing else
        self.model._compiled_call_impl = None
        self.compiled, self.watch, self.eager_now = False, None, False

    def describe(self) -> str:
        """What this fast path computes in and why, e.g. "bfloat16: measured 206 GFLOP/s against
        float32's 42 on this CPU; compiled: 1.10x eager on a batch of [8, 3, 224, 224]"."""
        return f"{self.choice}; {'compiled' if self.compiled else 'eager'}: {self.compile_reason}{self.switches}"


def compile_key(fast: Inference, example: torch.Tensor) -> str:
    """What a measured compilation gain holds for: this machine (CPU model, instruction sets and
    threads, or the GPU), torch, the model's architecture, the precision, the input's shape."""
    config = getattr(fast.model, "config", None)
    shapes = [(name, tuple(p.shape)) for name, p in fast.model.state_dict().items()]
    architecture = repr(config) if config is not None else (
        type(fast.model).__qualname__ + " " + hashlib.sha256(repr(shapes).encode()).hexdigest()[:16])
    return json.dumps({**measured_on(example.device), "model": architecture, "dtype": str(fast.dtype),
                       "input": list(example.shape), "mode": fast.mode}, sort_keys=True)


COMPILE_MUST_BE = 1.05  # x eager's speed on the example, for compile="auto" to keep the compiled model
WATCH_SLOWER = 1.5  # x compiled's settled seconds per call: a call this slow is checked against eager
RECHECK_EVERY = 16  # calls between two such checks (each costs one call of the other path)
COMPILE_CACHE = "compile_gain.json"


def for_inference(model: nn.Module, dtype: torch.dtype | str | None = None, compile: bool | str = "auto",
                  example: torch.Tensor | None = None, mode: str | None = None) -> Inference:
    """`model` for inference, its weights cast once to the fastest precision of its device, and compiled
    with frozen weights where that is faster on this machine.

    `dtype`: None or "auto" picks what the device computes fastest (`vitzoo.fastest`: on a GPU bf16
    where native, else fp16; on a CPU float32, bf16 or fp16 from a one-off measurement of the model's
    MLP product, cached per machine); or float32, bfloat16, float16 as asked. The result's `describe()`
    says what was picked and why.

    The model is converted in place, as `model.to(dtype)` does: put in eval mode, its parameters frozen
    (requires_grad False) and cast, so that the half-precision weights replace the float32 ones instead
    of sitting beside them (half the memory of the weights). `copy.deepcopy(model)` first to keep the
    float32 model. Every tensor runs in `dtype`, the residual stream included; under autocast it
    would stay in float32, so bf16 outputs differ from autocast's within bf16's rounding.

    `compile="auto"` (the default) times the eager and the compiled model (Inductor with frozen weights,
    see `compile_for_inference`) on the first batch, in turns and repeated, and keeps the compiled one
    only where it is `COMPILE_MUST_BE` x faster and the gain plausible; a trusted gain (its repeats agree)
    is kept per machine, model, precision and batch shape, so the next process compiles only where it
    paid, and checks there that compiled is still not slower than eager (the compilation takes tens of
    seconds on a small CPU, once per process; other batch shapes are compiled again when they come). `compile=True` always compiles,
    `False` never. `example`, a batch of the shape that will be used, settles this at once instead of at
    the first call.
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
    if example is not None and not (isinstance(example, torch.Tensor) and example.is_floating_point()):
        raise ValueError("example must be a batch of floating-point images, as the model is called with")
    fast = Inference(model.eval().requires_grad_(False).to(choice.dtype), choice.dtype, choice, compile, mode)
    if compile and example is not None:
        fast.settle_compilation(example.to(choice.dtype))
    return fast


def compile_for_training(model: nn.Module, mode: str | None = None) -> nn.Module:
    """The model compiled (forward and backward) for training; parameters stay shared with `model`."""
    return torch.compile(model, mode=mode, dynamic=False)
