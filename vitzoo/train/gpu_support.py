"""Whether this torch build can use the machine's NVIDIA GPUs, said before anything runs on them.

A torch wheel is built for one CUDA release, with kernels for a list of GPU generations
(`torch.cuda.get_arch_list()`: the CUDA 13 wheels have sm_75, Turing, and newer). Two mismatches fail
obscurely otherwise:

- a driver older than the wheel's CUDA needs: `torch.cuda.is_available()` is False (with at most a
  warning at import), and `--device auto` would train on the CPU without a word: `cuda_unavailable`
  names the cause when a GPU is present;
- a GPU older than the wheel's kernels (a V100 is sm_70): CUDA is available, and the first kernel
  fails ("no kernel image is available for execution on the device"): `unsupported_gpu` says so at
  start.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

# where the NVIDIA driver announces GPUs, whether or not this torch can use them
NVIDIA_PROBES = (Path("/proc/driver/nvidia/gpus"), Path("/dev/nvidia0"))
# the oldest driver branch of each CUDA major release (its minor version compatibility)
MINIMUM_DRIVER = {"11": "450", "12": "525", "13": "580"}
ARCH = re.compile(r"(sm|compute)_(\d+)(\d)([a-z]?)")


def nvidia_gpu_present(probes: tuple[Path, ...] | None = None) -> bool:
    """Whether the machine has an NVIDIA GPU with a driver loaded (a folder of GPUs that lists any, or a
    device node), by `probes` (default NVIDIA_PROBES)."""
    for probe in NVIDIA_PROBES if probes is None else probes:
        try:
            if probe.is_dir():
                if any(probe.iterdir()):
                    return True
            elif probe.exists():
                return True
        except OSError:  # unreadable: no answer from this probe
            continue
    return False


def cuda_unavailable(probes: tuple[Path, ...] | None = None) -> str | None:
    """Why CUDA is unavailable to torch on a machine that has an NVIDIA GPU; None without one."""
    if not nvidia_gpu_present(probes):
        return None
    if torch.version.cuda is None:
        return (f"this machine has an NVIDIA GPU, but torch {torch.__version__} is built without CUDA; install a "
                "CUDA build of torch")
    driver = MINIMUM_DRIVER.get(torch.version.cuda.split(".")[0])
    needed = f" (driver {driver} or newer)" if driver else ""
    return (f"this machine has an NVIDIA GPU, but torch {torch.__version__} cannot use it: most likely the NVIDIA "
            f"driver is older than this torch's CUDA {torch.version.cuda} needs{needed}; `nvidia-smi` shows the "
            "driver's version. Update the driver, or install a torch wheel built for an older CUDA")


def runs_on(arch: str, major: int, minor: int) -> bool:
    """Whether code of `arch` (an entry of `torch.cuda.get_arch_list()`) runs on a GPU of compute
    capability major.minor. Machine code (sm_XY) runs on the GPUs of its major generation from its
    minor on (sm_80 on an 8.6); PTX (compute_XY) is compiled when loaded for any GPU from X.Y on; an
    architecture-specific target (sm_90a) on that generation alone."""
    match = ARCH.fullmatch(arch)
    if match is None:
        return False
    kind, built, suffix = match[1], (int(match[2]), int(match[3])), match[4]
    if suffix == "a":
        return built == (major, minor)
    if kind == "sm":
        return built[0] == major and built[1] <= minor
    return built <= (major, minor)


def unsupported_gpu(index: int) -> str | None:
    """Why this torch build cannot run on GPU `index` (its generation is older than the build's
    kernels), or None. Builds that list no architectures (ROCm, custom) are taken as they are."""
    arches = torch.cuda.get_arch_list()
    if not arches or getattr(torch.version, "hip", None):
        return None
    major, minor = torch.cuda.get_device_capability(index)
    if any(runs_on(arch, major, minor) for arch in arches):
        return None
    return (f"GPU {index} ({torch.cuda.get_device_name(index)}) has compute capability {major}.{minor} (sm_{major}{minor}), "
            f"but torch {torch.__version__} (CUDA {torch.version.cuda}) has kernels for {', '.join(arches)} only, so "
            f"every computation on it would fail. Install a torch wheel whose build includes sm_{major}{minor} "
            "(`torch.cuda.get_arch_list()` lists a build's; wheels for an older CUDA, such as cu126, include older "
            "GPUs), or use --device cpu")


__all__ = ["MINIMUM_DRIVER", "NVIDIA_PROBES", "cuda_unavailable", "nvidia_gpu_present", "runs_on", "unsupported_gpu"]
