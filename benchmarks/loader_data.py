"""The input benchmark's files: ImageNet-sized JPEGs with the statistics of photographs, and trees of
empty files as large as a dataset's listing.

No photographs ship with the project, so the JPEGs are drawn: a decoder's time follows the entropy it
decodes (the file's size, at a quality and a chroma subsampling), not what the picture shows. Each image
is 500x375 (ImageNet's most common size) with a 1/f^0.92 amplitude spectrum in luminance (photographs'
spectra fall as 1/f^0.8-1.2) and a smoother, weaker one in two chroma channels, a few occluding
ellipses of their own texture (the sharp edges photographs have), and a little sensor noise; saved by
PIL at quality 90 with 4:2:0 chroma subsampling, as most of ImageNet is. They come out at about 110 KB
(ImageNet's training JPEGs average about 110 KB), and the benchmark records their mean size.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

SPECTRUM = 0.92  # luminance amplitude ~ 1/f^SPECTRUM: files of about 110 KB at quality 90


@dataclass(frozen=True)
class PhotoSpec:
    """What the folder of JPEGs holds (in ImageNet's layout, so that `FolderImages` lists it)."""

    images: int = 256
    classes: int = 8
    width: int = 500
    height: int = 375
    quality: int = 90
    seed: int = 0


def _field(height: int, width: int, exponent: float, generator: torch.Generator,
           device: torch.device | str = "cpu") -> torch.Tensor:
    """A random field of zero mean and unit variance whose amplitude spectrum falls as 1/f^exponent
    (drawn on the CPU, transformed on `device`)."""
    fy = torch.fft.fftfreq(height, device=device)[:, None]
    fx = torch.fft.rfftfreq(width, device=device)[None, :]
    f = (fy**2 + fx**2).sqrt().clamp_min(1.0 / max(height, width))
    shape = (height, fx.shape[1])
    draws = [torch.randn(shape, generator=generator).to(device) for _ in range(2)]
    spectrum = torch.complex(*draws) / f**exponent
    x = torch.fft.irfft2(spectrum, s=(height, width))
    return (x - x.mean()) / x.std()


def photo_like(spec: PhotoSpec, index: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Image `index` of `spec`: uint8 (3, height, width) on the CPU, a function of (spec.seed, index) alone
    (computed on `device`: a GPU's rounding differs)."""
    g = torch.Generator().manual_seed(spec.seed * 1_000_003 + index)
    h, w = spec.height, spec.width
    luminance = _field(h, w, SPECTRUM, g, device)
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float32, device=device),
                            torch.arange(w, dtype=torch.float32, device=device), indexing="ij")
    for _ in range(int(torch.randint(2, 6, (1,), generator=g))):  # occluding objects, each its own texture
        cy, cx = (torch.rand(2, generator=g) * torch.tensor([h, w])).tolist()
        ry, rx = (20 + torch.rand(2, generator=g) * torch.tensor([h / 2, w / 2])).tolist()
        inside = (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2) < 1
        texture = _field(h, w, SPECTRUM, g, device) * 0.8 + float(torch.randn((), generator=g)) * 0.8
        luminance = torch.where(inside, texture, luminance)
    a, b = _field(h, w, SPECTRUM + 0.3, g, device), _field(h, w, SPECTRUM + 0.3, g, device)
    rgb = torch.stack([luminance + 0.25 * a, luminance - 0.15 * a + 0.15 * b, luminance - 0.3 * b])
    base = (torch.rand(3, 1, 1, generator=g) * 0.5 + 0.25).to(device)
    rgb = base + 0.18 * rgb + 0.01 * torch.randn((3, h, w), generator=g).to(device)
    return (rgb.clamp(0, 1) * 255).round().to(torch.uint8).cpu()


def photo_folder(root: Path, spec: PhotoSpec = PhotoSpec(), device: torch.device | str = "cpu") -> Path:
    """`root` holding `spec`'s JPEGs as ROOT/train/<class>/*.JPEG (and one image a class in val/),
    written now unless it holds exactly them (benchmarks.rehearsal_data.written_once)."""
    from PIL import Image

    from benchmarks.rehearsal_data import written_once

    def write(staging: Path) -> None:
        for i in range(spec.images + spec.classes):
            split, c = ("train", i % spec.classes) if i < spec.images else ("val", i - spec.images)
            folder = staging / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = photo_like(spec, i, device).permute(1, 2, 0).numpy()
            Image.fromarray(pixels).save(folder / f"n{c:08d}_{i}.JPEG", "JPEG", quality=spec.quality, subsampling="4:2:0")

    return written_once(root, spec, write)


def empty_tree(root: Path, files: int, classes: int = 100) -> Path:
    """ROOT/<class>/<name>.JPEG, `files` empty files in `classes` folders, named as ImageNet's are: what
    listing a dataset reads (its directories), not its images. Kept while it holds that many."""
    root = Path(root)
    marker = root / f".{files}x{classes}"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    per_class = math.ceil(files / classes)
    for c in range(classes):
        folder = root / f"n{c:08d}"
        folder.mkdir(parents=True)
        for i in range(min(per_class, files - c * per_class)):
            (folder / f"n{c:08d}_{i}.JPEG").touch()
    marker.touch()
    return root


def mean_file_bytes(root: Path) -> float:
    sizes = [p.stat().st_size for p in Path(root).glob("train/*/*.JPEG")]
    return sum(sizes) / max(len(sizes), 1)


__all__ = ["PhotoSpec", "empty_tree", "mean_file_bytes", "photo_folder", "photo_like"]
