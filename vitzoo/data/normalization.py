"""Normalisation, on the device and batched: uint8 images -> floats with the model's `mean` and `std`.

The datasets yield uint8 tensors (C, H, W); conversion to float and normalisation happen once a batch
is on the device (a uint8 batch is a quarter of the bytes of a float32 one to copy there). Gray images
become the model's `in_chans` channels here.
"""

from __future__ import annotations

import torch

from vitzoo.errors import DataError


class Normalizer:
    """uint8 (B, C, H, W) on `device` -> normalised float; gray becomes `in_chans` channels.

    The mean and std tensors are made once: made per batch, each would be a copy from the host that
    waits for the device (and for the batch's non_blocking copy before it)."""

    def __init__(self, mean, std, in_chans: int, device: torch.device | str, dtype: torch.dtype = torch.float32) -> None:
        self.in_chans, self.dtype = in_chans, dtype
        self.mean = torch.tensor(mean, device=device, dtype=dtype).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device, dtype=dtype).view(1, -1, 1, 1)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        x = images.to(self.dtype).div_(255)
        if x.shape[1] != self.in_chans:
            if x.shape[1] == 1:
                x = x.expand(-1, self.in_chans, -1, -1)
            elif self.in_chans == 1:
                x = x.mean(dim=1, keepdim=True)
            else:
                raise DataError(f"images have {x.shape[1]} channels but the model takes in_chans={self.in_chans}")
        return (x - self.mean) / self.std


def normalize(images: torch.Tensor, mean, std, in_chans: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 (B, C, H, W) on any device -> normalised float (one batch; a loop makes a `Normalizer` once)."""
    return Normalizer(mean, std, in_chans, images.device, dtype)(images)


__all__ = ["Normalizer", "normalize"]
