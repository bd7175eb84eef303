"""Where and when a number was measured: the commit, the CPU (model, family, the instruction sets its
kernels use), the GPU's name, torch and the threads, recorded with every result of every benchmark."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from vitzoo import precision
from vitzoo.train.distributed import pick_device

# the instruction sets the CPU's matrix and element-wise kernels dispatch on (oneDNN, PyTorch's
# vectorised kernels): two CPUs of one name and family can still differ here
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_fp16", "sve", "bf16")


def cpu_model() -> str:
    """The CPU's model name and family (Linux: /proc/cpuinfo), e.g. "AMD EPYC (family 25)": a number
    is only comparable beside its CPU."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    pairs = (line.split(":", 1) for line in info.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in pairs}
    name = fields.get("model name", platform.machine())
    return f"{name} (family {fields['cpu family']})" if "cpu family" in fields else name


def cpu_flags() -> list[str]:
    """The CPU_FLAGS this CPU has, in that order; elsewhere than Linux the vector width PyTorch
    dispatches to (torch.backends.cpu.get_cpu_capability())."""
    present = precision.cpu_flags()
    if not present:
        return [torch.backends.cpu.get_cpu_capability().lower()]
    return [flag for flag in CPU_FLAGS if flag in present]


def git_commit() -> str:
    """The checkout's commit (with -dirty for uncommitted changes), or "unknown"; VITZOO_COMMIT, where
    set, names it for a tree copied to another machine (whose .git may be missing or stale)."""
    if os.environ.get("VITZOO_COMMIT"):
        return os.environ["VITZOO_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=10)
        # results written by the run itself do not make the code it measured dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                                ":(top,exclude)benchmarks/results"], capture_output=True,
                               text=True, cwd=Path(__file__).parent, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def gpu_name(device: str) -> str | None:
    """The name of the GPU `device` stands for (`auto`, `cuda`, `cuda:1`), or None off CUDA."""
    if not torch.cuda.is_available():
        return None
    where = pick_device(device)
    return torch.cuda.get_device_name(where) if where.type == "cuda" else None


def environment(device: str) -> dict[str, Any]:
    """Where and when a number was measured: recorded with every result of every benchmark (on CUDA
    with the GPU's name: "cuda" alone does not say which GPU; the CPU with its family and the
    instruction sets its kernels use, which decide how its numbers compare with another CPU's)."""
    gpu = gpu_name(device)
    return {
        "device": device,
        **({"gpu": gpu} if gpu else {}),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


__all__ = ["CPU_FLAGS", "cpu_flags", "cpu_model", "environment", "git_commit", "gpu_name"]
