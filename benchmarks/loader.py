"""python -m benchmarks loader: the images/s one loader worker (one process, one thread) feeds
training per scale that reads image files, and the start-up that grows with a dataset; the plan
(benchmarks/plan_inputs.py) reads its record, benchmarks/results/loader/results.json.

Paths timed, the fastest of a few passes: `pil` (PIL decodes), `torchvision.io` (the workers'
path), `device path` (the workers' share when the GPU decodes), `evaluation` (decode and resize).
No photographs ship with the project: the JPEGs are drawn with photographs' statistics (a decoder's
time follows the entropy it decodes, not what the picture shows): ImageNet's most common size, a
1/f luminance spectrum, occluding shapes, sensor noise, quality 90 with 4:2:0 chroma (~110 KB).
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from benchmarks.machine import environment
from benchmarks.rehearsal_data import FolderSpec, image_folder, written_once
from benchmarks.scales import SCALES, rehearsal_model
from benchmarks.suite import RESULTS, markdown_table
from vitzoo import data as datasets
from vitzoo.argvalues import ArgumentParser
from vitzoo.data.folders import FileImages, FolderImages
from vitzoo.data.transforms import (EncodedSamples, collate_encoded, decode_batch, decode_rgb,
                                    device_ops, read_bytes)
from vitzoo.io import write_text

OUT, WORK = RESULTS / "loader", Path("runs") / "loader"  # WORK: the drawn files, kept
FILE_SCALES = ("gpu", "paper", "rehearsal")
PATHS = ("pil", "torchvision.io", "device path", "evaluation")
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


def empty_tree(root: Path, files: int, classes: int = 100) -> Path:
    """`files` empty files named as ImageNet's in `classes` folders: what a listing reads."""
    if (root / f".{files}x{classes}").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    per_class = math.ceil(files / classes)
    for c in range(classes):
        (root / f"n{c:08d}").mkdir(parents=True)
        for i in range(min(per_class, files - c * per_class)):
            (root / f"n{c:08d}" / f"n{c:08d}_{i}.JPEG").touch()
    (root / f".{files}x{classes}").touch()
    return root


def mean_file_bytes(root: Path) -> float:
    sizes = [p.stat().st_size for p in Path(root).glob("train/*/*.JPEG")]
    return sum(sizes) / max(len(sizes), 1)


# ---------------------------------------------------------------- one worker's rates
class PILImages(FileImages):
    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image
        from torchvision.transforms.v2.functional import pil_to_tensor

        with Image.open(self.paths[index]) as image:
            return pil_to_tensor(image.convert("RGB")), int(self.targets[index])


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
    pil = datasets.Transformed(PILImages(files.paths, files.targets.tolist(), files.classes),
                               augmented, seed=0)
    plain = datasets.Transformed(files, datasets.build_transform((side, side), None))
    keys, indices = [(0, i) for i in range(len(files))], list(range(len(files)))
    rates = {"pil": best_rate(pil.__getitem__, keys, micro, default_collate, passes),
             "torchvision.io": best_rate(train.__getitem__, keys, micro, default_collate, passes),
             "device path": best_rate(EncodedSamples(train, device_ops(augmented)).__getitem__,
                                      keys, micro, collate_encoded, passes),
             "evaluation": best_rate(plain.__getitem__, indices, max(micro, 256), default_collate,
                                     passes)}
    return {"scale": scale, "img_size": side, "micro_batch": micro,
            "augment": {k: v for k, v in vars(augment).items() if v}, "images": len(files),
            "images_per_s": {k: round(v, 1) for k, v in rates.items()}}


def measure_decode(folder: Path, passes: int) -> dict[str, float]:
    files = datasets.load_split(str(folder), "train")
    pil, indices = PILImages(files.paths, files.targets.tolist(), files.classes), range(len(files))
    decoded = lambda i: decode_rgb(read_bytes(files.paths[i]))  # noqa: E731
    return {name: round(best_rate(fetch, list(indices), 64, list, passes), 1)
            for name, fetch in (("torchvision.io", decoded), ("pil", pil.__getitem__))}


# ---------------------------------------------------------------- start-up
def measure_listing(work: Path, files: int, passes: int) -> dict[str, float]:
    """Files/s of listing an ImageFolder tree, its page cache warm (the second listing on)."""
    tree = empty_tree(work / f"listing-{files}", files)
    FolderImages(tree)
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        FolderImages(tree)
        best = min(best, time.perf_counter() - start)
    return {"files": files, "seconds": round(best, 4), "files_per_s": round(files / best, 1)}


class Listed(Dataset):
    """As large as a folder of `files` images to pickle (distinct paths), items costing nothing."""

    def __init__(self, files: int) -> None:
        self.images = FileImages([f"/data/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG"
                                  for i in range(files)], [i % 1000 for i in range(files)],
                                 [f"n{c:08d}" for c in range(1000)])

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> int:
        return index


def first_item_seconds(dataset: Dataset, workers: int, context) -> float:
    """Seconds from making a loader to a batch from each of its `workers`."""
    start = time.perf_counter()
    iterator = iter(DataLoader(dataset, batch_size=1, num_workers=workers,
                               multiprocessing_context=context))
    for _ in range(workers):
        next(iterator)
    seconds = time.perf_counter() - start
    del iterator
    return seconds


def measure_worker_start(files: list[int], workers: list[int], passes: int) -> dict[str, Any]:
    """Seconds to start loader workers, forked and from a fork server (its own start apart), fit
    as fixed + k (per worker + per worker per million files x n) by least squares."""
    server = multiprocessing.get_context("forkserver")
    multiprocessing.set_forkserver_preload(["torch", "torchvision", "vitzoo", "vitzoo.data"])
    start = time.perf_counter()
    first_item_seconds(Listed(0), 1, server)
    out: dict[str, Any] = {"fork_server_first_loader_s": round(time.perf_counter() - start, 3)}
    for name, context in (("fork", multiprocessing.get_context("fork")), ("forkserver", server)):
        # a forked worker inherits the dataset: only the fork server's figures grow with it
        points = [(n, k, min(first_item_seconds(Listed(n), k, context) for _ in range(passes)))
                  for n in (files if name == "forkserver" else files[:1]) for k in workers]
        x = torch.tensor([[1.0, k, k * n / 1e6] for n, k, _ in points], dtype=torch.float64)
        y = torch.tensor([[s] for *_, s in points], dtype=torch.float64)
        fit = torch.linalg.lstsq(x[:, :2] if name == "fork" else x, y).solution.flatten().tolist()
        a, b, c = (fit + [0.0])[:3]
        out[name] = {"points": [{"files": n, "workers": k, "seconds": round(s, 4)}
                                for n, k, s in points], "fixed_s": round(a, 4),
                     "per_worker_s": round(b, 4), "per_worker_per_million_files_s": round(c, 4)}
    return out


def measure_first_batch(folder: Path, scale: str) -> dict[str, float]:
    """Seconds from making a scale's training loader (one forked worker) to its first batch."""
    from vitzoo.train import GlobalBatchSampler

    side, micro, augment = pipeline(scale)
    files = datasets.load_split(str(folder), "train")
    dataset = datasets.Transformed(files, datasets.build_transform((side, side), augment), seed=0)
    micro = min(micro, len(files))
    start = time.perf_counter()
    sampler = GlobalBatchSampler(len(files), micro, micro, 0, 1, 0, 0)
    next(iter(DataLoader(dataset, batch_sampler=sampler, num_workers=1)))
    return {"scale": scale, "micro_batch": micro, "seconds": round(time.perf_counter() - start, 3)}


def device_rates(folder: Path, device: torch.device, workers: int = 8, micro_batch: int = 64,
                 passes: int = 4, sides: tuple[int, ...] = (128, 224)) -> dict[str, Any]:
    """gpu-check's figures at each side: `device_decode` (the device alone on micro-batches read
    before), `device_path` (workers read, the device decodes), `worker_path` (workers decode)."""
    files = datasets.load_split(str(folder), "train")
    keys = [(epoch, i) for epoch in range(passes) for i in range(len(files))]
    batches = [keys[i:i + micro_batch] for i in range(0, len(keys) - micro_batch + 1, micro_batch)]
    out: dict[str, Any] = {"images": len(files), "workers": workers, "micro_batch": micro_batch,
                           "device": str(device)}
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
        rates["worker_path_per_worker"] = rates["worker_path"] / max(workers, 1)
        out[f"{side}px"] = {k: round(v, 1) for k, v in rates.items()}
    return out


# ---------------------------------------------------------------- the benchmark
def measure(work: Path = WORK, quick: bool = False) -> dict[str, Any]:
    """Every figure, in this process of one thread (the start-up figures' workers are processes)."""
    threads, load_before, began = torch.get_num_threads(), os.getloadavg(), time.perf_counter()
    torch.set_num_threads(1)
    try:
        spec, passes = (PhotoSpec(images=16), 1) if quick else (PhotoSpec(), 3)
        photos = photo_folder(work / ("photos-quick" if quick else "photos"), spec)
        rehearsal = image_folder(work / "rehearsal", FolderSpec())
        record = {
            "environment": {**environment("cpu"), "threads": 1,
                            "load_average_before": [round(v, 2) for v in load_before]},
            "quick": quick,
            "images": {name: {**vars(spec), "mean_bytes": round(mean_file_bytes(folder))}
                       for name, spec, folder in (("imagenet_like", spec, photos),
                                                  ("rehearsal", FolderSpec(), rehearsal))},
            "pipelines": [measure_pipelines(rehearsal if name == "rehearsal" else photos, name,
                                            passes) for name in FILE_SCALES],
            "decode_only": measure_decode(photos, passes),
            "listing": measure_listing(work, 2_000 if quick else 100_000, passes),
            "worker_start": measure_worker_start([0, 2_000] if quick else [0, 400_000],
                                                 [1, 2] if quick else [1, 2, 4], passes),
            "first_batch": [measure_first_batch(photos, scale) for scale in ("paper", "gpu")],
        }
    finally:
        torch.set_num_threads(threads)
    record["environment"]["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    record["seconds"] = round(time.perf_counter() - began, 1)
    return record


def report(record: dict[str, Any]) -> str:
    env, photos = record["environment"], record["images"]["imagenet_like"]
    # the benchmark's own process adds about 1 to the load average while it runs
    before, after = env["load_average_before"][0], env["load_average_after"][0]
    shared = (f" **The CPU was shared**: load average {before:.2f} before it started, {after:.2f} "
              f"at its end (its own process about 1 of that) on {os.cpu_count()} cores; the rates "
              "are the fastest of three passes, which other processes slow least."
              if before > 0.5 or after > 1.5 else
              " The CPU was quiet (its own process makes most of the load at the end).")
    rows = []
    for p in record["pipelines"]:  # and 8 workers of the torchvision.io path
        rates = [p["images_per_s"][k] for k in PATHS] + [8 * p["images_per_s"]["torchvision.io"]]
        rows.append([p["scale"], p["img_size"], p["micro_batch"], *(f"{r:,.0f}" for r in rates)])
    start, listed = record["worker_start"], record["listing"]["files_per_s"]
    startup = [["listing a folder (warm page cache)", f"{listed:,.0f} files/s",
                f"{1_281_167 / listed:.1f} s for ImageNet's 1,281,167"],
               ["fork server's start (once per rank)",
                f"{start['fork_server_first_loader_s']:.2f} s", ""]]
    for how, s in ((how, start[how]) for how in ("fork", "forkserver")):
        each = s["per_worker_s"] + 1.281167 * s["per_worker_per_million_files_s"]
        startup.append([f"a loader's workers, {how}",
                        f"{s['fixed_s']:.3f} s + {s['per_worker_s']:.3f} s a worker + "
                        f"{s['per_worker_per_million_files_s']:.3f} s a worker per million files",
                        f"{s['fixed_s'] + 8 * each:.1f} s for 8 workers on ImageNet"])
    startup += [[f"first micro-batch of the {f['scale']} scale (1 worker)", f"{f['seconds']:.2f} s",
                 f"{f['micro_batch']} images"] for f in record["first_batch"]]
    return "\n".join([
        "# Input pipeline: images per second of one loader worker", "",
        f"`python -m benchmarks loader`, {env['date']}, commit {env['commit']}, {env['cpu']}, one "
        f"process of one thread per figure, torch {env['torch']}; load average {before:.2f} before "
        f"and {after:.2f} after, {record['seconds']:.0f} s in all.{shared}", "",
        f"Files: {photos['images']} JPEGs of {photos['width']}x{photos['height']} drawn with "
        "photographs' 1/f spectrum and occluding edges (benchmarks/loader.py), quality "
        f"{photos['quality']}, 4:2:0, {photos['mean_bytes'] / 1000:.0f} KB on average (ImageNet's: "
        f"about 110 KB); the rehearsal's own {record['images']['rehearsal']['side']}-px JPEGs. "
        "Decode only (read and decode, 500x375): torchvision.io "
        f"{record['decode_only']['torchvision.io']:,.0f} images/s, PIL "
        f"{record['decode_only']['pil']:,.0f}.", "",
        "Training images per second of one worker (read, decode, random-resized crop and flip, "
        "collate), the fastest of three passes; `device path`: the workers' share when the GPU "
        "decodes (read, header, draws); `evaluation`: decode and resize:", "",
        markdown_table(["scale", "px", "micro-batch", *PATHS, "8 workers (torchvision.io)"], rows),
        "", "Start-up that grows with the dataset (benchmarks/plan.py extrapolates it to "
        "ImageNet):", "", markdown_table(["what", "measured", "extrapolated"], startup), ""])


def main(out: Path = OUT, work: Path = WORK, quick: bool = False) -> dict[str, Any]:
    record = measure(work, quick)
    write_text(out / "results.json", json.dumps(record, indent=1) + "\n")
    write_text(out / "README.md", report(record))
    return record


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m benchmarks.loader", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the results (default: committed)")
    parser.add_argument("--work", type=Path, default=WORK, help="where the drawn files are kept")
    parser.add_argument("--quick", action="store_true", help="a few files, one pass (a check)")
    return parser


if __name__ == "__main__":
    args = build_parser().parse_args()
    main(args.out, args.work, args.quick)
    print((args.out / "README.md").read_text())
