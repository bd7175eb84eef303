"""Numeric precision in one place: the names `--precision` and `for_inference` take, and the rule of
which precision a device computes fastest in, read from what it reports (nothing is timed):

- a CUDA GPU: bf16 where native (A100, H100 and later), fp16 where bf16 is emulated (T4, V100);
- a CPU: bf16 where it has bf16 matrix instructions (amx_bf16 or avx512_bf16), else float32;
- MPS: bf16.
Training's `auto` is the GPU's half precision on CUDA and float32 elsewhere, so that a run on a CPU
computes the same numbers on every CPU; `--precision bf16` asks for bf16.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vitzoo.errors import ConfigError

# --precision's values: the rules, then the fixed values with their autocast dtypes (None: float32)
RULES = ("auto", "gpu-half")
FIXED = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = (*RULES, *FIXED)
NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
SPELLINGS = {**{long: dtype for dtype, long in NAMES.items()},  # a dtype's names: long and short
             **{short: dtype or torch.float32 for short, dtype in FIXED.items()}}
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def flag(dtype: torch.dtype | None) -> str:
    """The --precision value of `dtype` (None or float32: "fp32")."""
    dtype = None if dtype == torch.float32 else dtype
    return next(short for short, autocast_dtype in FIXED.items() if autocast_dtype == dtype)


def autocast(device: torch.device | str, dtype: torch.dtype | None) -> torch.autocast:
    """Mixed precision in `dtype` on `device` (or its type); float32 for None, even inside an outer
    autocast."""
    device_type = device if isinstance(device, str) else device.type
    return torch.autocast(device_type, dtype=dtype or torch.float32, enabled=dtype is not None)


def sum_dtype(device: torch.device) -> torch.dtype:  # of sums kept on a device (MPS: no f64)
    return torch.float32 if device.type == "mps" else torch.float64


def native_bf16(device: torch.device) -> bool:  # T4s and V100s only emulate it
    with torch.cuda.device(device):
        return torch.cuda.is_bf16_supported(including_emulation=False)


def half_of(device: torch.device | str) -> torch.dtype:
    """The half precision of `device`: bf16, but fp16 on a CUDA GPU that only emulates bf16."""
    device = torch.device(device)
    return torch.float16 if device.type == "cuda" and not native_bf16(device) else torch.bfloat16


def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags (Linux: /proc/cpuinfo's flags, or Features on ARM)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in info.splitlines()
                 if line.split(":")[0].strip() in ("flags", "Features")), "")
    return frozenset(line.split(":", 1)[-1].split())


@dataclasses.dataclass(frozen=True)
class Choice:  # a precision, and what the device reported that picked it
    dtype: torch.dtype
    reason: str

    def __str__(self) -> str:
        return f"{NAMES[self.dtype]}: {self.reason}"


def fastest(device: torch.device | str, flags: frozenset[str] | None = None) -> Choice:
    """The precision `device` computes fastest in, by the rule above (`flags`: the CPU's, this
    machine's where None)."""
    device = torch.device(device)
    if device.type == "cuda":
        half = half_of(device)
        return Choice(half, "the GPU only emulates bf16" if half == torch.float16
                      else "the GPU computes bf16 natively")
    if device.type != "cpu":
        return Choice(torch.bfloat16, f"{device.type} computes bf16")
    have = sorted(set(CPU_BF16_FLAGS) & (cpu_flags() if flags is None else flags))
    if have:
        return Choice(torch.bfloat16, f"the CPU has {' and '.join(have)}")
    return Choice(torch.float32, f"the CPU has neither {' nor '.join(CPU_BF16_FLAGS)}")


def training_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (None: float32) `--precision` trains in on `device`: a rule is the GPU's
    half precision on CUDA and float32 elsewhere; a fixed value is itself (fp16 on CUDA only)."""
    if precision in RULES:
        precision = flag(half_of(device)) if device.type == "cuda" else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("--precision fp16 needs CUDA (use bf16 or fp32)")
    return FIXED[precision]
