"""Numeric precision, in one place: its names and dtypes, and the rule of which precision a device
computes in. Training (`--precision`), inference (`vitzoo.inference.for_inference`), the measured
choice (`vitzoo.fastest`) and the benchmarks all read it here.

- Names: `--precision` takes a rule (`auto`, `gpu-half`) or a fixed value (`fp32`, `bf16`, `fp16`);
  each dtype also has its long name (`float32`, `bfloat16`, `float16`), and `dtype_named` reads either
  spelling (`VITZOO_CPU_PRECISION=bf16` and `=bfloat16` alike).
- The GPU rule: bf16 where the GPU computes it natively (A100, H100 and later), fp16 where bf16 is only
  emulated (T4, V100: several times slower than their fp16). Nothing is measured.
- The CPU rule: nothing says, so speeds are measured (`vitzoo.fastest`) and `pick` applies the rule to
  them: a half precision only where it is clearly faster (`HALF_MUST_BE` x float32's speed: it computes
  less exactly); of bf16 and fp16 the faster, bf16 on a near tie (its range is float32's, fp16
  overflows above 65504). `VITZOO_CPU_PRECISION` fixes the CPU's precision without measuring.
- Training: `training_dtype` resolves `--precision` to an autocast dtype by the same rule (training picks
  between float32 and bf16 on a CPU, as autocast has no fp16 there).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable

import torch

from vitzoo.errors import ConfigError

# --precision's values: the rules first, then the fixed values with their autocast dtypes (None: float32)
RULES = ("auto", "gpu-half")
FIXED = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = (*RULES, *FIXED)
NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}  # the long names
INFERENCE_DTYPES = tuple(NAMES)
HALF_MUST_BE = 1.10  # x float32's measured speed, for a half precision to be picked
NEAR_TIE = 1.05  # fp16 must beat bf16 by this much to be picked over it
CPU_PRECISION_VARIABLE = "VITZOO_CPU_PRECISION"


def dtype_named(name: str, where: str = "precision") -> torch.dtype:
    """The dtype a name spells: float32/fp32, bfloat16/bf16, float16/fp16; a ValueError naming `where`
    the name came from and the spellings it takes otherwise."""
    spellings = {**{long: dtype for dtype, long in NAMES.items()}, **{short: dtype or torch.float32 for short, dtype in FIXED.items()}}
    if name not in spellings:
        raise ValueError(f"{where}={name!r}: use one of {', '.join(spellings)}")
    return spellings[name]


def flag(dtype: torch.dtype | None) -> str:
    """The fixed --precision value that computes in `dtype` (None or float32: "fp32")."""
    dtype = None if dtype == torch.float32 else dtype
    return next(short for short, autocast_dtype in FIXED.items() if autocast_dtype == dtype)


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> torch.autocast:
    """Mixed precision in `dtype` on `device` (a device or its type), or none for `dtype` None: float32,
    even inside an outer autocast."""
    device_type = device if isinstance(device, str) else device.type
    return torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None)


def sum_dtype(device: torch.device) -> torch.dtype:
    """The dtype of sums kept on `device`: float64, except on MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64


def native_bf16(device: torch.device) -> bool:
    """Whether the GPU computes in bfloat16 natively: T4s and V100s only emulate it, slowly (fp16 is
    the half precision to use there)."""
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported(including_emulation=False)


def gpu_half(device: torch.device) -> torch.dtype:
    """The half precision of a CUDA `device`: bf16 where it is native (A100, H100 and later), fp16 where
    bf16 is only emulated (T4, V100: several times slower than their fp16)."""
    return torch.bfloat16 if native_bf16(device) else torch.float16


def half_of(device: torch.device | str) -> torch.dtype:
    """The half precision to compute in on `device` without measuring: a CUDA GPU's `gpu_half`, bf16
    elsewhere (what the benchmarks time as "half precision"; on a CPU `vitzoo.fastest` measures)."""
    device = torch.device(device)
    return gpu_half(device) if device.type == "cuda" else torch.bfloat16


@dataclasses.dataclass(frozen=True)
class Choice:
    """A precision, why it was picked, and the measured speeds behind it (GFLOP/s per long name; empty
    where nothing was measured)."""

    dtype: torch.dtype
    reason: str
    gflops: dict[str, float] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        return f"{NAMES[self.dtype]}: {self.reason}"


def candidates(training: bool) -> tuple[torch.dtype, ...]:
    """The precisions a CPU may compute in: every one in inference, float32 and bf16 in training
    (autocast has no fp16 on the CPU)."""
    return (torch.float32, torch.bfloat16) if training else INFERENCE_DTYPES


def pick(gflops: dict[str, float], candidates: tuple[torch.dtype, ...]) -> Choice:
    """The precision of `candidates` to compute in on a CPU, by the rule above, from measured speeds
    (GFLOP/s by long name; other keys are left out of the Choice)."""
    gflops = {name: gflops[name] for name in NAMES.values()}
    base = gflops["float32"]
    halves = sorted((d for d in candidates if d is not torch.float32), key=lambda d: -gflops[NAMES[d]])
    if torch.bfloat16 in halves and torch.float16 in halves and gflops["float16"] < NEAR_TIE * gflops["bfloat16"]:
        halves.remove(torch.bfloat16)
        halves.insert(0, torch.bfloat16)  # a near tie goes to bf16, the range of float32
    for half in halves:
        if gflops[NAMES[half]] >= HALF_MUST_BE * base:
            return Choice(half, f"measured {gflops[NAMES[half]]:.0f} GFLOP/s against float32's {base:.0f} on this CPU",
                          gflops)
    fastest = max((gflops[NAMES[d]] for d in halves), default=0.0)
    return Choice(torch.float32, f"no half precision is {HALF_MUST_BE:.2f}x faster than float32 ({base:.0f} GFLOP/s) "
                                 f"on this CPU (the fastest: {fastest:.0f})", gflops)


def choose(device: torch.device | str, training: bool, measure_cpu: Callable[[], dict[str, float]]) -> Choice:
    """The precision to compute in on `device`: on a GPU by the GPU rule; on a CPU the precision
    `VITZOO_CPU_PRECISION` fixes, else `pick` from `measure_cpu()`'s speeds. In inference every
    precision is a candidate; in `training` (autocast) float32 and bf16 on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        if gpu_half(device) == torch.bfloat16:
            return Choice(torch.bfloat16, f"{torch.cuda.get_device_name(device)} computes bf16 natively")
        return Choice(torch.float16, f"{torch.cuda.get_device_name(device)} only emulates bf16: fp16 is its half precision")
    if device.type != "cpu":
        return Choice(torch.bfloat16, f"not measured on {device.type}: bf16")
    fixed = os.environ.get(CPU_PRECISION_VARIABLE)
    if fixed:
        dtype = dtype_named(fixed, CPU_PRECISION_VARIABLE)
        return Choice(dtype if dtype in candidates(training) else torch.float32, f"{CPU_PRECISION_VARIABLE}={fixed} (not measured)")
    return pick(measure_cpu(), candidates(training))


def training_dtype(precision: str, device: torch.device, measured: Callable[[], torch.dtype] | None = None) -> torch.dtype | None:
    """The autocast dtype (None: float32) that `--precision` `precision` trains in on `device`.

    `gpu-half`, a fixed rule: the GPU's half precision on CUDA, float32 elsewhere. `auto`: the same on
    GPUs; on the CPU bf16 where `measured()` (the CPU's choice between float32 and bf16) says so. A fixed
    value is itself, fp16 only on CUDA (the CPU's autocast has none).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "auto" and device.type == "cpu":
        if measured is None:
            raise ValueError("--precision auto on the CPU is measured on the model: pass it")
        precision = flag(measured())
    if precision in RULES:
        precision = flag(gpu_half(device)) if device.type == "cuda" else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("--precision fp16 needs CUDA (use bf16 or fp32)")
    return FIXED[precision]


__all__ = ["FIXED", "INFERENCE_DTYPES", "NAMES", "PRECISIONS", "RULES", "Choice", "autocast", "candidates", "choose", "dtype_named", "flag",
           "gpu_half", "half_of", "native_bf16", "pick", "sum_dtype", "training_dtype"]
