"""Where and when a number was measured: the commit, the CPU (model, family, the instruction sets
its kernels use), the GPU, torch and the threads, recorded with every result of every benchmark."""

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

# what oneDNN's and PyTorch's kernels dispatch on: two CPUs of one name can differ here
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_fp16", "sve", "bf16")


def cpu_model() -> str:
    """The CPU's name and family (Linux: /proc/cpuinfo), e.g. "AMD EPYC (family 25)"."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(tuple(s.strip() for s in line.split(":", 1)) for line in info.splitlines()
                  if ":" in line)
    name = fields.get("model name", platform.machine())
    return f"{name} (family {fields['cpu family']})" if "cpu family" in fields else name


def cpu_flags() -> list[str]:
    """The CPU_FLAGS this CPU has; elsewhere than Linux, the vector width PyTorch dispatches to."""
    present = precision.cpu_flags()
    if not present:
        return [torch.backends.cpu.get_cpu_capability().lower()]
    return [flag for flag in CPU_FLAGS if flag in present]


def git_commit() -> str:
    """The checkout's commit, -dirty with uncommitted changes outside the results; VITZOO_COMMIT
    names it for a tree copied to a machine without its .git."""
    if os.environ.get("VITZOO_COMMIT"):
        return os.environ["VITZOO_COMMIT"]
    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=here, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ":(top)", ":(top,exclude)benchmarks/results"],
                               capture_output=True, text=True, cwd=here, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty else "") if head.returncode == 0 else "unknown"


def gpu_name(device: str) -> str | None:
    """The name of the GPU `device` stands for (`auto`, `cuda`, `cuda:1`), None off CUDA."""
    if not torch.cuda.is_available():
        return None
    where = pick_device(device)
    return torch.cuda.get_device_name(where) if where.type == "cuda" else None


def environment(device: str) -> dict[str, Any]:
    gpu = gpu_name(device)
    return {"device": device, **({"gpu": gpu} if gpu else {}), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpu": cpu_model(), "cpu_flags": cpu_flags(),
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
