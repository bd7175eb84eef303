"""The machine a number or a choice belongs to: the CPU's model, family and the instruction sets its
kernels use. Machines of one size differ in CPU (bf16 is 5x float32's speed on one, a third slower on
another), so measured results and choices are kept with it."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name and family (Linux: /proc/cpuinfo), e.g. "AMD EPYC (family 25)": machines of
    one size differ in CPU, and a number is only comparable beside its CPU."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    name = fields.get("model name", platform.machine())
    return f"{name} (family {fields['cpu family']})" if "cpu family" in fields else name


# the instruction sets the CPU's matrix and element-wise kernels dispatch on (oneDNN, PyTorch's vectorised
# kernels): two CPUs of one name and family can still differ here, and bf16 speed hangs on the last four
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile",
             "amx_bf16", "amx_fp16", "sve", "bf16")


def cpu_flags() -> list[str]:
    """The CPU_FLAGS this CPU has (Linux: /proc/cpuinfo's flags, or Features on ARM), in that order;
    elsewhere the vector width PyTorch dispatches to (torch.backends.cpu.get_cpu_capability())."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return [torch.backends.cpu.get_cpu_capability().lower()]
    line = next((line for line in info.splitlines() if line.split(":")[0].strip() in ("flags", "Features")), "")
    present = set(line.split(":", 1)[-1].split())
    return [flag for flag in CPU_FLAGS if flag in present]


__all__ = ["CPU_FLAGS", "cpu_flags", "cpu_model"]
