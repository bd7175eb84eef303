"""Numeric precision: the one autocast context of training, evaluation, compilation and the
benchmarks, the dtype of sums kept on a device, and whether a GPU computes in bfloat16 natively."""

from __future__ import annotations

import torch


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
    bf16 is only emulated (T4, V100: several times slower than their fp16). The one rule that inference
    (`vitzoo.fast`), the measured choice (`vitzoo.fastest`) and training's `gpu-half` follow."""
    return torch.bfloat16 if native_bf16(device) else torch.float16


__all__ = ["autocast", "gpu_half", "native_bf16", "sum_dtype"]
