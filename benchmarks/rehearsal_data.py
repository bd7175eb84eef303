"""The rehearsal's dataset: a small ImageNet of JPEG files in ImageNet's layout
(ROOT/train/n00000000/n00000000_0.JPEG, ROOT/val/n00000000/ILSVRC2012_val_00000001.JPEG), which
loader workers decode as they decode ImageNet's. Each class is stripes of its own angle, frequency
and colour at a random phase, with noise: a small model learns them in a few steps. A dry run
writes nothing: it plans the folder, and the plan counts its images as written (`planned`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class FolderSpec:
    classes: int = 10
    train_per_class: int = 32
    val_per_class: int = 8
    side: int = 40  # pixels: more than the model's input, so that crops and resizes do work
    seed: int = 0

    @property
    def train_images(self) -> int:
        return self.classes * self.train_per_class

    @property
    def val_images(self) -> int:
        return self.classes * self.val_per_class


def draw(spec: FolderSpec, c: int, generator: torch.Generator) -> torch.Tensor:
    """One uint8 (3, side, side) image of class `c`."""
    angle, frequency = math.pi * c / spec.classes, 2 + c % 3
    colour = torch.tensor([(c * 0.37) % 1, (c * 0.61) % 1, (c * 0.83) % 1])
    axis = torch.linspace(-1, 1, spec.side)
    y, x = torch.meshgrid(axis, axis, indexing="ij")
    phase = torch.rand((), generator=generator) * 2 * math.pi
    wave = torch.sin(math.pi * frequency * (x * math.cos(angle) + y * math.sin(angle)) + phase)
    image = 0.5 + 0.35 * wave[None] * (0.4 + colour[:, None, None])
    image = image + 0.08 * torch.randn((3, spec.side, spec.side), generator=generator)
    return (image.clamp(0, 1) * 255).round().to(torch.uint8)


def _write(spec: FolderSpec, root: Path) -> None:
    from PIL import Image

    generator, number = torch.Generator().manual_seed(spec.seed), 0
    for c in range(spec.classes):
        for split, count in (("train", spec.train_per_class), ("val", spec.val_per_class)):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                number += split == "val"
                name = f"n{c:08d}_{i}.JPEG" if split == "train" else \
                    f"ILSVRC2012_val_{number:08d}.JPEG"
                pixels = draw(spec, c, generator).permute(1, 2, 0).numpy()
                Image.fromarray(pixels).save(folder / name, "JPEG", quality=90)


PLANNED: dict[str, FolderSpec] = {}  # folders a dry run planned: resolved path -> their spec


def image_folder(root: str | os.PathLike, spec: FolderSpec = FolderSpec(),
                 write: bool = True) -> Path:
    """The folder at `root` holding `spec`'s images, written unless it holds them already;
    `write=False` (a dry run) only plans it."""
    if not write:
        PLANNED[str(Path(root).resolve())] = spec
        return Path(root)
    return written_once(root, spec, lambda staging: _write(spec, staging))


def planned(root: str | os.PathLike) -> FolderSpec | None:
    return PLANNED.get(str(Path(root).resolve()))


def written_once(root: str | os.PathLike, spec: Any, write: Callable[[Path], None]) -> Path:
    """`root` as `write(folder)` makes it for the dataclass `spec`, made now unless its spec.json
    says it holds that: written beside it and renamed into place, so that a reader sees all or
    nothing; a folder of another spec is replaced, one of other files refused."""
    root, stamp = Path(root), json.dumps(asdict(spec), sort_keys=True)

    def done() -> bool:
        return (root / "spec.json").is_file() and (root / "spec.json").read_text() == stamp

    if done():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        write(staging)
        (staging / "spec.json").write_text(stamp)
        if done():  # another process wrote it meanwhile
            return root
        if root.exists() and not (root / "spec.json").is_file() and any(root.iterdir()):
            raise FileExistsError(f"{root} holds other files; remove it or choose another folder")
        shutil.rmtree(root, ignore_errors=True)  # a folder of another spec
        with contextlib.suppress(OSError):  # another process renamed its copy in first
            os.replace(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def image_shards(root: str | os.PathLike, spec: FolderSpec = FolderSpec(),
                 samples_per_shard: int = 64) -> Path:
    """The folder's images as tar shards in ROOT/shards/, written once."""
    from vitzoo.data.sharding import write_shards

    folder = image_folder(root, spec)
    write_shards(folder, folder / "shards", samples_per_shard=samples_per_shard, progress=False)
    return folder / "shards"
