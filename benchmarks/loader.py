"""python -m benchmarks loader: how many images one loader worker feeds training, per scale that reads
image files, and what a run's start costs that grows with its dataset.

A worker is one process with one thread: the rates here are per CPU core, and a run's loader gives
them times its `num_workers` times its processes (benchmarks/plan.py plans with them). For each scale
that trains on image files (`gpu`: 128 px, `paper`: 224 px, on ImageNet-sized JPEGs written once,
benchmarks/loader_data.py; `rehearsal`: 32 px on its own 40-px JPEGs) it times what a worker does
for a micro-batch of training images, the fastest of a few passes over the files (what the code
costs, not what other processes took meanwhile):

- `pil`: the path before vitzoo.data.decode: PIL opens and decodes, then the scale's augmentation
  (random-resized crop, flip) and the collation into a uint8 batch;
- `torchvision.io`: the workers' path now: the file's bytes, libjpeg-turbo through torchvision.io, the
  same augmentation and collation;
- `device path`: the workers' share when the device decodes (`--decode device`): the bytes, the JPEG
  header, the crop and flip drawn, collated (the decoding is the GPU's: gpu-check measures it);
- `evaluation`: decode and resize to the model's size (the evaluation loaders' work);
- decode only (read and decode, nothing else): torchvision.io and PIL.

Start-up that grows with the dataset: listing a folder (files/s, `FolderImages` on a tree of empty
files, warm in the page cache), starting loader workers (forked, and from a fork server, as the ranks
of a distributed run start them on Python < 3.12, where the dataset is pickled to every worker: seconds
per worker and per million files), and the first batch of a training loader. Results go to
benchmarks/results/loader/ (results.json with the CPU, threads, load average, date and commit; README.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks.loader_data import PhotoSpec, empty_tree, mean_file_bytes, photo_folder
from benchmarks.machine import environment
from benchmarks.rehearsal_data import FolderSpec, image_folder
from benchmarks.scales import SCALES, rehearsal_model
from benchmarks.suite import RESULTS, markdown_table
from vitzoo import data as datasets
from vitzoo.data.decode import FileImages, decode_rgb, read_bytes
from vitzoo.data.encoded import EncodedSamples, collate_encoded, device_ops
from vitzoo.io import write_text

OUT = RESULTS / "loader"
WORK = Path("runs") / "loader"  # the written files (ignored by git), reused while their spec matches
FILE_SCALES = ("gpu", "paper", "rehearsal")  # the scales whose runs read image files
PATHS = ("pil", "torchvision.io", "device path", "evaluation")


class PILImages(FileImages):
    """The worker path before vitzoo.data.decode: PIL opens and decodes each file."""

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image
        from torchvision.transforms.v2 import functional as TF

        with Image.open(self.paths[index]) as image:
            return TF.pil_to_tensor(image.convert("RGB")), int(self.targets[index])


def scale_pipeline(name: str) -> dict[str, Any]:
    """What a scale's training loader does: the model's input size, the micro-batch, the augmentation."""
    scale = SCALES[name]
    train = scale.train
    options = rehearsal_model(scale.zoo_name, scale.model) if scale.shrink else scale.model
    side = options.get("img_size", 224)
    return {"img_size": side if isinstance(side, int) else side[0], "micro_batch": train.get("micro_batch") or train["batch_size"],
            "augment": datasets.Augment(random_resized_crop=train.get("random_resized_crop", 0.0), hflip=train.get("hflip", False))}


def best_rate(fetch: Callable[[Any], Any], keys: list, batch: int, collate: Callable, passes: int) -> float:
    """Images per second of `fetch` over `keys`, collated `batch` at a time: the fastest of `passes`."""
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        for i in range(0, len(keys), batch):
            collate([fetch(k) for k in keys[i : i + batch]])
        best = min(best, time.perf_counter() - start)
    return len(keys) / best


def measure_pipelines(folder: Path, scale: str, passes: int) -> dict[str, Any]:
    """Images/s of one worker for each path, at the scale's size, augmentation and micro-batch."""
    from torch.utils.data import default_collate

    setup = scale_pipeline(scale)
    size = (setup["img_size"], setup["img_size"])
    files = datasets.load_split(str(folder), "train")
    pil = PILImages(files.paths, files.targets.tolist(), files.classes)
    augmented = datasets.build_transform(size, setup["augment"])
    keys = [(0, i) for i in range(len(files))]
    train_tv = datasets.Transformed(files, augmented, seed=0)
    encoded = EncodedSamples(train_tv, device_ops(augmented))
    plain = datasets.Transformed(files, datasets.build_transform(size, None))
    rates = {"pil": best_rate(datasets.Transformed(pil, augmented, seed=0).__getitem__, keys, setup["micro_batch"],
                              default_collate, passes),
             "torchvision.io": best_rate(train_tv.__getitem__, keys, setup["micro_batch"], default_collate, passes),
             "device path": best_rate(encoded.__getitem__, keys, setup["micro_batch"], collate_encoded, passes),
             "evaluation": best_rate(plain.__getitem__, list(range(len(files))), max(setup["micro_batch"], 256),
                                     default_collate, passes)}
    return {"scale": scale, "img_size": setup["img_size"], "micro_batch": setup["micro_batch"],
            "augment": {k: v for k, v in vars(setup["augment"]).items() if v}, "images": len(files),
            "images_per_s": {k: round(v, 1) for k, v in rates.items()}}


def measure_decode(folder: Path, passes: int) -> dict[str, float]:
    """Read and decode alone (no augmentation), images/s of one worker."""
    files = datasets.load_split(str(folder), "train")
    pil = PILImages(files.paths, files.targets.tolist(), files.classes)
    keep = lambda batch: batch  # noqa: E731
    return {"torchvision.io": round(best_rate(lambda i: decode_rgb(read_bytes(files.paths[i])), list(range(len(files))), 64,
                                              keep, passes), 1),
            "pil": round(best_rate(pil.__getitem__, list(range(len(files))), 64, keep, passes), 1)}


# ---------------------------------------------------------------------------- start-up
def measure_listing(work: Path, files: int, passes: int) -> dict[str, float]:
    """Files per second of listing an ImageFolder tree (its page cache warm: the second listing on)."""
    from vitzoo.data.sources import FolderImages

    tree = empty_tree(work / f"listing-{files}", files)
    FolderImages(tree)  # the first listing warms the page cache
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        FolderImages(tree)
        best = min(best, time.perf_counter() - start)
    return {"files": files, "seconds": round(best, 4), "files_per_s": round(files / best, 1)}


class _Cheap(Dataset):
    """A dataset as large as a folder of `files` images (its paths and labels), whose items cost nothing."""

    def __init__(self, files: int) -> None:
        # distinct strings, as a listing makes them (pickle writes a repeated object once)
        paths = [f"/data/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i}.JPEG" for i in range(files)]
        self.images = FileImages(paths, [i % 1000 for i in range(files)], [f"n{c:08d}" for c in range(1000)])

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, index: int) -> int:
        return index


def first_item_seconds(dataset: Dataset, workers: int, context) -> float:
    """Seconds from making a loader of `workers` to its first batch (every worker started)."""
    start = time.perf_counter()
    loader = DataLoader(dataset, batch_size=1, num_workers=workers, multiprocessing_context=context)
    iterator = iter(loader)
    for _ in range(workers):  # one batch from every worker: all of them have started
        next(iterator)
    seconds = time.perf_counter() - start
    del iterator, loader
    return seconds


def measure_worker_start(files: list[int], workers: list[int], passes: int) -> dict[str, Any]:
    """Seconds to start `workers` loader workers over datasets of `files` paths, forked and from a fork
    server (its own start once, measured apart); per worker and per million files by least squares."""
    out: dict[str, Any] = {}
    server = multiprocessing.get_context("forkserver")
    multiprocessing.set_forkserver_preload(["torch", "torchvision", "vitzoo", "vitzoo.data"])
    start = time.perf_counter()
    first_item_seconds(_Cheap(0), 1, server)
    out["fork_server_first_loader_s"] = round(time.perf_counter() - start, 3)
    for name, context in (("fork", multiprocessing.get_context("fork")), ("forkserver", server)):
        # seconds = a + k (b + c n): each worker started one after another, from a fork server the dataset
        # pickled to each; a forked worker inherits it (c = 0: only the fork server's figures grow with it)
        sizes = files if name == "forkserver" else files[:1]
        points = [(n, k, min(first_item_seconds(_Cheap(n), k, context) for _ in range(passes))) for n in sizes for k in workers]
        x = torch.tensor([[1.0, k, k * n / 1e6] for n, k, _ in points], dtype=torch.float64)
        y = torch.tensor([s for *_, s in points], dtype=torch.float64)
        if name == "fork":
            x = x[:, :2]
        a, b, c = (torch.linalg.lstsq(x, y[:, None]).solution.flatten().tolist() + [0.0])[:3]
        out[name] = {"points": [{"files": n, "workers": k, "seconds": round(s, 4)} for n, k, s in points],
                     "fixed_s": round(a, 4), "per_worker_s": round(b, 4), "per_worker_per_million_files_s": round(c, 4)}
    return out


def measure_first_batch(folder: Path, scale: str) -> dict[str, float]:
    """Seconds from making a scale's training loader (one forked worker) to its first micro-batch."""
    from vitzoo.train import GlobalBatchSampler

    setup = scale_pipeline(scale)
    files = datasets.load_split(str(folder), "train")
    size = (setup["img_size"],) * 2
    dataset = datasets.Transformed(files, datasets.build_transform(size, setup["augment"]), seed=0)
    micro = min(setup["micro_batch"], len(files))
    start = time.perf_counter()
    sampler = GlobalBatchSampler(len(files), micro, micro, 0, 1, 0, 0)
    loader = DataLoader(dataset, batch_sampler=sampler, num_workers=1)
    next(iter(loader))
    return {"scale": scale, "micro_batch": micro, "seconds": round(time.perf_counter() - start, 3)}


# ---------------------------------------------------------------------------- the benchmark
def measure(work: Path = WORK, quick: bool = False) -> dict[str, Any]:
    """Every figure, one thread, in this process (the workers of the start-up figures are processes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    began = time.perf_counter()
    try:
        spec = PhotoSpec(images=16) if quick else PhotoSpec()
        photos = photo_folder(work / ("photos-quick" if quick else "photos"), spec)
        rehearsal = image_folder(work / "rehearsal", FolderSpec())
        passes = 1 if quick else 3
        pipelines = [measure_pipelines(rehearsal if name == "rehearsal" else photos, name, passes) for name in FILE_SCALES]
        record = {
            "environment": {**environment("cpu"), "threads": 1, "load_average_before": [round(v, 2) for v in load_before]},
            "quick": quick,
            "images": {"imagenet_like": {**vars(spec), "mean_bytes": round(mean_file_bytes(photos))},
                       "rehearsal": {**vars(FolderSpec()), "mean_bytes": round(mean_file_bytes(rehearsal))}},
            "pipelines": pipelines,
            "decode_only": measure_decode(photos, passes),
            "listing": measure_listing(work, 2_000 if quick else 100_000, passes),
            "worker_start": measure_worker_start([0, 2_000] if quick else [0, 400_000], [1, 2] if quick else [1, 2, 4],
                                                 1 if quick else 3),
            "first_batch": [measure_first_batch(photos, "paper"), measure_first_batch(photos, "gpu")],
        }
    finally:
        torch.set_num_threads(threads)
    record["environment"]["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    record["seconds"] = round(time.perf_counter() - began, 1)
    return record


def report(record: dict[str, Any]) -> str:
    env = record["environment"]
    # the benchmark's own process adds about 1 to the load average while it runs
    before, after = env["load_average_before"][0], env["load_average_after"][0]
    shared = (f" **The CPU was shared**: load average {before:.2f} before it started, {after:.2f} at its end (its own "
              f"process about 1 of that) on {os.cpu_count()} cores; the rates are the fastest of three passes, which "
              "other processes slow least." if before > 0.5 or after > 1.5 else
              " The CPU was quiet (its own process makes most of the load at the end).")
    photos = record["images"]["imagenet_like"]
    rows = [[p["scale"], p["img_size"], p["micro_batch"], *(f"{p['images_per_s'][k]:,.0f}" for k in PATHS),
             f"{p['images_per_s']['torchvision.io'] * 8:,.0f}"] for p in record["pipelines"]]
    start, listing = record["worker_start"], record["listing"]
    startup = [["listing a folder (warm page cache)", f"{listing['files_per_s']:,.0f} files/s",
                f"{1_281_167 / listing['files_per_s']:.1f} s for ImageNet's 1,281,167"],
               ["fork server's start (once per rank)", f"{start['fork_server_first_loader_s']:.2f} s", ""]]
    for how in ("fork", "forkserver"):
        s = start[how]
        startup.append([f"a loader's workers, {how}", f"{s['fixed_s']:.3f} s + {s['per_worker_s']:.3f} s a worker + "
                        f"{s['per_worker_per_million_files_s']:.3f} s a worker per million files",
                        f"{s['fixed_s'] + 8 * (s['per_worker_s'] + 1.281167 * s['per_worker_per_million_files_s']):.1f} s "
                        "for 8 workers on ImageNet"])
    for first in record["first_batch"]:
        startup.append([f"first micro-batch of the {first['scale']} scale (1 worker)", f"{first['seconds']:.2f} s",
                        f"{first['micro_batch']} images"])
    decode = record["decode_only"]
    return "\n".join([
        "# Input pipeline: images per second of one loader worker",
        "",
        f"`python -m benchmarks loader`, {env['date']}, commit {env['commit']}, {env['cpu']}, one process of one thread "
        f"per figure, torch {env['torch']}; load average {env['load_average_before'][0]:.2f} before and "
        f"{env['load_average_after'][0]:.2f} after, {record['seconds']:.0f} s in all.{shared}",
        "",
        f"Files: {photos['images']} JPEGs of {photos['width']}x{photos['height']} drawn with photographs' 1/f spectrum "
        f"and occluding edges (benchmarks/loader_data.py), quality {photos['quality']}, 4:2:0, "
        f"{photos['mean_bytes'] / 1000:.0f} KB on average (ImageNet's: about 110 KB); the rehearsal's own "
        f"{record['images']['rehearsal']['side']}-px JPEGs. Decode only (read and decode, 500x375): torchvision.io "
        f"{decode['torchvision.io']:,.0f} images/s, PIL {decode['pil']:,.0f}.",
        "",
        "Training images per second of one worker (read, decode, random-resized crop and flip, collate), the "
        "fastest of three passes; `device path`: the workers' share when the GPU decodes (read, header, draws); "
        "`evaluation`: decode and resize:",
        "",
        markdown_table(["scale", "px", "micro-batch", *PATHS, "8 workers (torchvision.io)"], rows),
        "",
        "Start-up that grows with the dataset (benchmarks/plan.py extrapolates it to ImageNet):",
        "",
        markdown_table(["what", "measured", "extrapolated"], startup),
        "",
    ])


def main(out: Path = OUT, work: Path = WORK, quick: bool = False) -> dict[str, Any]:
    record = measure(work, quick)
    write_text(out / "results.json", json.dumps(record, indent=1) + "\n")
    write_text(out / "README.md", report(record))
    return record


def recorded(path: Path = OUT / "results.json") -> dict[str, Any]:
    """The committed measurement (benchmarks/plan.py plans with it)."""
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; measure it on a quiet machine: python -m benchmarks loader")
    return json.loads(path.read_text())


def build_parser() -> argparse.ArgumentParser:
    from vitzoo.argvalues import ArgumentParser

    parser = ArgumentParser(prog="python -m benchmarks.loader", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where the results go (default: the committed ones)")
    parser.add_argument("--work", type=Path, default=WORK, help="where the measured files are written (once)")
    parser.add_argument("--quick", action="store_true", help="a few files, one pass (a check, not a measurement)")
    return parser


if __name__ == "__main__":
    args = build_parser().parse_args()
    main(args.out, args.work, args.quick)
    print((args.out / "README.md").read_text())
    sys.exit(0)
