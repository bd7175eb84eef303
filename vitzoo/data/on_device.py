"""A batch of encoded images (vitzoo.data.encoded) decoded and augmented on the training device.

The JPEGs of a batch are decoded in one call (`torchvision.io.decode_jpeg` of the list, on CUDA nvJPEG's
batched decoder), then each is cropped, resized and flipped by its own steps (their sizes differ, so one
image at a time), into one uint8 batch. A JPEG the batched decoder refuses (a CMYK one nvJPEG does not
read, a damaged one) is decoded alone on the CPU, as a worker would (`decode_rgb`: PIL where libjpeg-turbo
fails), then moved: one bad file costs one image's time, not the batch. Images a worker decoded
already (not JPEGs) are moved as they are.
"""

from __future__ import annotations

import torch

from vitzoo.data.decode import decode_rgb
from vitzoo.data.encoded import DECODED, DeviceOps, EncodedBatch, apply_steps


def decode_jpegs(encoded: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """uint8 (3, H, W) RGB images on `device`, one per JPEG of `encoded` (1-D uint8 tensors on the host)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    if not encoded:
        return []
    on = device if device.type == "cuda" else "cpu"
    try:
        images = decode_jpeg(encoded, mode=ImageReadMode.RGB, device=on)
    except RuntimeError:  # one image spoils the batch: each alone, the ones the decoder refuses on the CPU
        images = []
        for data in encoded:
            try:
                images.append(decode_jpeg(data, mode=ImageReadMode.RGB, device=on))
            except RuntimeError:
                images.append(decode_rgb(data))
    return [image.to(device, non_blocking=True) for image in images]


def decode_batch(batch: EncodedBatch, ops: DeviceOps, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images (B, 3, *ops.size) on `device`, labels on the host) of an encoded batch."""
    rows = batch.steps.tolist()
    to_decode = [i for i, row in enumerate(rows) if not row[DECODED]]
    images = torch.empty((len(rows), 3, *ops.size), dtype=torch.uint8, device=device)
    for i, image in zip(to_decode, decode_jpegs([batch.payloads[i] for i in to_decode], device)):
        images[i] = apply_steps(ops, image, rows[i])
    for i, row in enumerate(rows):
        if row[DECODED]:
            images[i] = batch.payloads[i].to(device, non_blocking=True)
    return images, batch.labels


__all__ = ["decode_batch", "decode_jpegs"]
