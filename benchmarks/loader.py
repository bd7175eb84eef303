"""python -m benchmarks loader: the images/s one loader worker (one process, one thread) feeds
training at each scale that reads image files; gpu-check's `loader` step times the GPU's decoding.

Paths timed, the fastest of a few passes: `torchvision.io` (the workers' path) and `device path`
(the workers' share when the GPU decodes). No photographs ship with the project: the JPEGs are
drawn with photographs' statistics (a decoder's time follows the entropy it decodes, not what the
picture shows): ImageNet's most common size, a 1/f luminance spectrum, occluding shapes, sensor
noise, quality 90 with 4:2:0 chroma (~110 KB).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, default_collate

from benchmarks.rehearsal_data import FolderSpec, image_folder, written_once
from benchmarks.scales import SCALES, rehearsal_model
from benchmarks.suite import RESULTS, environment, markdown_table
from vitzoo import data as datasets
from vitzoo.data.transforms import EncodedSamples, collate_encoded, decode_batch, device_ops
from vitzoo.io import write_text

OUT, WORK = RESULTS / "loader", Path("runs") / "loader"  # WORK: the drawn files, kept
FILE_SCALES = ("gpu", "paper", "rehearsal")
PATHS = ("torchvision.io", "device path")
SPECTRUM = 0.92  # luminance amplitude ~ 1/f^SPECTRUM: files of about 110 KB at quality 90


# ---------------------------------------------------------------- the files
@dataclass(frozen=True)
class PhotoSpec:
    images: int = 256
    classes: int = 8
    width: int = 500
    height: int = 375
    quality: int = 90
    seed: int = 0


def _field(h: int, w: int, exponent: float, g: torch.Generator, device) -> torch.Tensor:
    """Zero mean, unit variance, an amplitude spectrum falling as 1/f^exponent."""
    f = (torch.fft.fftfreq(h, device=device)[:, None] ** 2
         + torch.fft.rfftfreq(w, device=device)[None, :] ** 2).sqrt().clamp_min(1.0 / max(h, w))
    draws = [torch.randn(f.shape, generator=g).to(device) for _ in range(2)]
    x = torch.fft.irfft2(torch.complex(*draws) / f**exponent, s=(h, w))
    return (x - x.mean()) / x.std()


def photo_like(spec: PhotoSpec, index: int, device="cpu") -> torch.Tensor:
    """Image `index` of `spec`, uint8 (3, H, W) on the CPU, drawn from (spec.seed, index) alone."""
    g, h, w = torch.Generator().manual_seed(spec.seed * 1_000_003 + index), spec.height, spec.width
    luminance = _field(h, w, SPECTRUM, g, device)
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float32, device=device),
                            torch.arange(w, dtype=torch.float32, device=device), indexing="ij")
    for _ in range(int(torch.randint(2, 6, (1,), generator=g))):  # objects of their own texture
        cy, cx = (torch.rand(2, generator=g) * torch.tensor([h, w])).tolist()
        ry, rx = (20 + torch.rand(2, generator=g) * torch.tensor([h / 2, w / 2])).tolist()
        inside = (((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2) < 1
        texture = _field(h, w, SPECTRUM, g, device) * 0.8 + float(torch.randn((), generator=g)) * .8
        luminance = torch.where(inside, texture, luminance)
    a, b = _field(h, w, SPECTRUM + 0.3, g, device), _field(h, w, SPECTRUM + 0.3, g, device)
    rgb = torch.stack([luminance + 0.25 * a, luminance - 0.15 * a + 0.15 * b, luminance - 0.3 * b])
    base = (torch.rand(3, 1, 1, generator=g) * 0.5 + 0.25).to(device)
    rgb = base + 0.18 * rgb + 0.01 * torch.randn((3, h, w), generator=g).to(device)
    return (rgb.clamp(0, 1) * 255).round().to(torch.uint8).cpu()


def photo_folder(root: Path, spec: PhotoSpec = PhotoSpec(), device="cpu") -> Path:
    """ROOT/train/<class>/*.JPEG (and one image a class in val/), written once."""
    from PIL import Image

    def write(staging: Path) -> None:
        for i in range(spec.images + spec.classes):
            split, c = ("train", i % spec.classes) if i < spec.images else ("val", i - spec.images)
            (staging / split / f"n{c:08d}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(photo_like(spec, i, device).permute(1, 2, 0).numpy()).save(
                staging / split / f"n{c:08d}" / f"n{c:08d}_{i}.JPEG", quality=spec.quality,
                subsampling="4:2:0")

    return written_once(root, spec, write)


# ---------------------------------------------------------------- one worker's rates
def best_rate(fetch: Callable, keys: list, batch: int, collate: Callable, passes: int) -> float:
    """Images/s of `fetch` over `keys`, collated `batch` at a time: the fastest of `passes`."""
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        for i in range(0, len(keys), batch):
            collate([fetch(k) for k in keys[i:i + batch]])
        best = min(best, time.perf_counter() - start)
    return len(keys) / best


def pipeline(scale: str) -> tuple[int, int, datasets.Augment]:
    """A scale's training input: (size, micro-batch, augmentation)."""
    s = SCALES[scale]
    side = (rehearsal_model(s.zoo_name, s.model) if s.shrink else s.model).get("img_size", 224)
    return (side if isinstance(side, int) else side[0],
            s.train.get("micro_batch") or s.train["batch_size"],
            datasets.Augment(random_resized_crop=s.train.get("random_resized_crop", 0.0),
                             hflip=s.train.get("hflip", False)))


def measure_pipelines(folder: Path, scale: str, passes: int) -> dict[str, Any]:
    side, micro, augment = pipeline(scale)
    files = datasets.load_split(str(folder), "train")
    augmented = datasets.build_transform((side, side), augment)
    train = datasets.Transformed(files, augmented, seed=0)
    keys = [(0, i) for i in range(len(files))]
    rates = {"torchvision.io": best_rate(train.__getitem__, keys, micro, default_collate, passes),
             "device path": best_rate(EncodedSamples(train, device_ops(augmented)).__getitem__,
                                      keys, micro, collate_encoded, passes)}
    return {"scale": scale, "img_size": side, "micro_batch": micro,
            "images_per_s": {k: round(v, 1) for k, v in rates.items()}}


def device_rates(folder: Path, device: torch.device, workers: int = 8, micro_batch: int = 64,
                 passes: int = 4, sides: tuple[int, ...] = (128, 224)) -> dict[str, Any]:
    """gpu-check's figures at each side: `device_decode` (the device alone on micro-batches read
    before), `device_path` (workers read, the device decodes), `worker_path` (workers decode)."""
    files = datasets.load_split(str(folder), "train")
    keys = [(epoch, i) for epoch in range(passes) for i in range(len(files))]
    batches = [keys[i:i + micro_batch] for i in range(0, len(keys) - micro_batch + 1, micro_batch)]
    out: dict[str, Any] = {"images": len(files), "workers": workers, "micro_batch": micro_batch}
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None

    def rate(batches, to_device) -> float:  # after a first batch: the workers' start
        iterator = iter(batches)
        to_device(next(iterator))
        sync()
        start, images = time.perf_counter(), sum(len(to_device(b)[1]) for b in iterator)
        sync()
        return images / (time.perf_counter() - start)

    for side in sides:
        augment = datasets.Augment(random_resized_crop=0.08, hflip=True)
        transformed = datasets.Transformed(files, datasets.build_transform((side,) * 2, augment))
        ops = device_ops(transformed.transform)
        encoded = EncodedSamples(transformed, ops)
        on_device = lambda batch: decode_batch(batch, ops, device)  # noqa: E731
        rates = {"device_decode": rate([collate_encoded([encoded[k] for k in b]) for b in batches],
                                       on_device),
                 "device_path": rate(DataLoader(encoded, batch_sampler=batches, num_workers=workers,
                                                collate_fn=collate_encoded), on_device),
                 "worker_path": rate(DataLoader(transformed, batch_sampler=batches,
                                                num_workers=workers,
                                                pin_memory=device.type == "cuda"),
                                     lambda b: (b[0].to(device, non_blocking=True), b[1]))}
        out[f"{side}px"] = {k: round(v, 1) for k, v in rates.items()}
    return out


# ---------------------------------------------------------------- the benchmark
def measure(work: Path = WORK, quick: bool = False) -> dict[str, Any]:
    """Every scale's rates, in this process of one thread: one loader worker."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        spec, passes = (PhotoSpec(images=16), 1) if quick else (PhotoSpec(), 3)
        photos = photo_folder(work / ("photos-quick" if quick else "photos"), spec)
        rehearsal = image_folder(work / "rehearsal", FolderSpec())
        return {"environment": {**environment("cpu"), "threads": 1},
                "pipelines": [measure_pipelines(rehearsal if name == "rehearsal" else photos,
                                                name, passes) for name in FILE_SCALES]}
    finally:
        torch.set_num_threads(threads)


def report(record: dict[str, Any]) -> str:
    env = record["environment"]
    rows = [[p["scale"], p["img_size"], p["micro_batch"],
             *(f"{p['images_per_s'][k]:,.0f}" for k in PATHS)] for p in record["pipelines"]]
    return "\n".join([
        "# Input pipeline: images per second of one loader worker", "",
        f"`python -m benchmarks loader`, {env['date']}, commit {env['commit']}, {env['cpu']}, "
        f"torch {env['torch']}, one process of one thread. Training images per second of one "
        "worker (read, decode, random-resized crop and flip, collate), the fastest of three "
        "passes; `device path`: the workers' share when the GPU decodes (read, header, draws):",
        "",
        markdown_table(["scale", "px", "micro-batch", *PATHS], rows), ""])


def main(out: Path = OUT, work: Path = WORK, quick: bool = False) -> dict[str, Any]:
    record = measure(work, quick)
    write_text(out / "results.json", json.dumps(record, indent=1) + "\n")
    write_text(out / "README.md", report(record))
    return record

