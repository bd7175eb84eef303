"""Where and when a number was measured: the commit, the CPU (its model, and the instruction sets
its kernels use), the GPU, torch and the threads, recorded with every result of every benchmark."""

from __future__ import annotations

import datetime
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
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(tuple(s.strip() for s in line.split(":", 1)) for line in lines if ":" in line)
    name = fields.get("model name", platform.machine())
    return f"{name} (family {fields['cpu family']})" if "cpu family" in fields else name


def git_commit() -> str:
    """The checkout's commit, -dirty with uncommitted changes outside the results."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).parent, check=True).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                    ":(top,exclude)benchmarks/results")
        return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(device: str) -> dict[str, Any]:
    where = pick_device(device) if torch.cuda.is_available() else torch.device("cpu")
    gpu = {"gpu": torch.cuda.get_device_name(where)} if where.type == "cuda" else {}
    return {"device": device, **gpu, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": cpu_model(), "cpu_flags": [f for f in CPU_FLAGS if f in precision.cpu_flags()],
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
