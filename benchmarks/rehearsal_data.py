"""The rehearsal's dataset: a small ImageNet, written on the fly as JPEG files in ImageNet's layout.

`--scale rehearsal` runs the paper-scale code path with every dimension shrunk; its data must take the
path ImageNet takes, so it is a folder of JPEG files that loader workers decode, not tensors in memory:

    ROOT/train/n00000000/n00000000_0.JPEG ...      (classes named as WordNet ids, as ImageNet's are)
    ROOT/val/n00000000/ILSVRC2012_val_00000001.JPEG ...

Each class is a striped pattern of its own orientation, frequency and colour, drawn at a random phase
with noise, so that a small model learns it within a few steps (the pipeline is exercised end to end,
accuracy moves off chance). The folder is written once per specification, into a temporary folder
renamed into place, and reused while its `spec.json` matches. `image_shards` writes the same images as
WebDataset tar shards (`vitzoo shard`) in ROOT/shards/, once, for the same runs on shards.

A dry run writes nothing: it only plans the folder (`image_folder(..., write=False)`), and the plan
counts the classes and images the folder will hold (`planned`) and reads them as the rehearsal's.
"""

from __future__ import annotations

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
    """What the folder holds: tens of classes, tens of images each (ImageNet: 1000 classes, ~1281 and 50)."""

    classes: int = 10
    train_per_class: int = 32
    val_per_class: int = 8
    side: int = 40  # pixels: larger than the model's input, so that cropping and resizing do real work
    seed: int = 0

    @property
    def train_images(self) -> int:
        return self.classes * self.train_per_class

    @property
    def val_images(self) -> int:
        return self.classes * self.val_per_class


def class_name(c: int) -> str:
    return f"n{c:08d}"


def draw(spec: FolderSpec, c: int, generator: torch.Generator) -> torch.Tensor:
    """One uint8 (3, side, side) image of class `c`: stripes of the class's angle and frequency in the
    class's colour, at a random phase and offset, plus noise."""
    angle = math.pi * c / spec.classes
    frequency = 2 + (c % 3)
    colour = torch.tensor([(c * 0.37) % 1, (c * 0.61) % 1, (c * 0.83) % 1])
    axis = torch.linspace(-1, 1, spec.side)
    y, x = torch.meshgrid(axis, axis, indexing="ij")
    phase = torch.rand((), generator=generator) * 2 * math.pi
    wave = torch.sin(math.pi * frequency * (x * math.cos(angle) + y * math.sin(angle)) + phase)
    image = 0.5 + 0.35 * wave[None] * (0.4 + colour[:, None, None])
    image = image + 0.08 * torch.randn((3, spec.side, spec.side), generator=generator)
    return (image.clamp(0, 1) * 255).round().to(torch.uint8)


def _write(spec: FolderSpec, root: Path) -> None:
    from PIL import Image  # (torchvision's own JPEG encoder is deprecated since 0.29)

    generator = torch.Generator().manual_seed(spec.seed)
    number = 0
    for c in range(spec.classes):
        for split, count in (("train", spec.train_per_class), ("val", spec.val_per_class)):
            folder = root / split / class_name(c)
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                if split == "train":
                    name = f"{class_name(c)}_{i}.JPEG"
                else:
                    number += 1
                    name = f"ILSVRC2012_val_{number:08d}.JPEG"
                Image.fromarray(draw(spec, c, generator).permute(1, 2, 0).numpy()).save(folder / name, "JPEG", quality=90)


# folders a dry run plans and does not write: their resolved path -> what they will hold
PLANNED: dict[str, FolderSpec] = {}


def image_folder(root: str | os.PathLike, spec: FolderSpec = FolderSpec(), write: bool = True) -> Path:
    """The folder at `root` holding `spec`'s images, written now unless it already holds exactly them
    (`written_once`). `write=False` (a dry run): nothing is written, the folder is only planned, so that
    the plan counts and reads it as the folder it will be (`planned`, `is_rehearsal_folder`)."""
    if not write:
        PLANNED[str(Path(root).resolve())] = spec
        return Path(root)
    return written_once(root, spec, lambda staging: _write(spec, staging))


def planned(root: str | os.PathLike) -> FolderSpec | None:
    """What a folder planned and not yet written will hold (its classes and images), else None."""
    return PLANNED.get(str(Path(root).resolve()))


def written_once(root: str | os.PathLike, spec: Any, write: Callable[[Path], None]) -> Path:
    """`root` as `write(folder)` makes it for the dataclass `spec`, made now unless it already holds
    exactly that (its spec.json names `spec`'s fields).

    Written into a temporary folder beside `root` and renamed into place: a reader (another process of
    the suite, a worker) sees the whole folder or none. A folder of another specification, or an empty
    one, is replaced; a folder holding other files is not ours, and is refused, never removed.
    """
    root = Path(root)
    stamp = json.dumps(asdict(spec), sort_keys=True)
    if (root / "spec.json").is_file() and (root / "spec.json").read_text() == stamp:
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        write(staging)
        (staging / "spec.json").write_text(stamp)
        if root.exists():
            if (root / "spec.json").is_file() and (root / "spec.json").read_text() == stamp:
                return root  # another process wrote it meanwhile
            if not (root / "spec.json").is_file() and any(root.iterdir()):
                raise FileExistsError(f"{root} exists and is not a folder of generated images; remove it or choose "
                                      "another folder")
            shutil.rmtree(root)  # ours, of another specification, or empty
        try:
            os.replace(staging, root)
        except OSError:  # another process renamed its copy in first: the same images
            if not ((root / "spec.json").is_file() and (root / "spec.json").read_text() == stamp):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def image_shards(root: str | os.PathLike, spec: FolderSpec = FolderSpec(), samples_per_shard: int = 64) -> Path:
    """The folder's images as tar shards in ROOT/shards/ (beside train/ and val/, which the folder's readers
    read alone), `samples_per_shard` each (several shards per split); written with the folder if need be,
    reused while they are the folder's (vitzoo.data.sharding resumes or keeps them)."""
    from vitzoo.data.sharding import write_shards

    folder = image_folder(root, spec)
    write_shards(folder, folder / "shards", samples_per_shard=samples_per_shard, progress=False)
    return folder / "shards"


def is_rehearsal_folder(root: str | os.PathLike) -> bool:
    """Whether `root` is a folder `image_folder` wrote (its spec.json names a FolderSpec's fields) or planned."""
    if planned(root) is not None:
        return True
    try:
        return set(json.loads((Path(root) / "spec.json").read_text())) == set(asdict(FolderSpec()))
    except (OSError, ValueError, TypeError):
        return False


__all__ = ["FolderSpec", "class_name", "draw", "image_folder", "image_shards", "is_rehearsal_folder",
           "planned", "written_once"]
