"""Two of gpu-check's measurements (benchmarks/gpu_check.py), each a function of its device so that the
CPU runs the same code in the tests:

- `loader_rates`: the training input pipeline's images/s at the scales' sizes (128 and 224 px), with
  the device decoding (`--decode device`: loader workers read bytes, the device decodes and augments a
  micro-batch at a time) and with the workers decoding (the path before), and the device's own rate
  (decoding and augmenting micro-batches already read: what decoding adds to the GPU's work);
- `training_mfu`: a ViT-B/16 training step, vitzoo against timm in one process on the same weights,
  bf16 autocast, compiled, and each one's model FLOP utilisation: FLOP/s achieved (vitzoo.count_flops
  of the forward and backward pass, the paper's count, for both) over the GPU's dense bf16 peak
  (`PEAK_BF16_TFLOPS`, NVIDIA's datasheets, without sparsity). A GPU not in the table gets no MFU: said so.

    python -m benchmarks.gpu_steps mfu OUT.json   # on GPU 0 (gpu-check runs it as a child, with a time limit)
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

# dense bf16 tensor-core peaks (TFLOP/s), by a pattern of torch.cuda.get_device_name; the first match counts
PEAK_BF16_TFLOPS: list[tuple[str, float]] = [
    (r"H100.*PCIe", 756.0),
    (r"H100.*NVL", 835.0),
    (r"H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    (r"H200.*NVL", 835.0),
    (r"H200", 989.0),  # SXM, and GH200
    (r"B200", 2250.0),
    (r"A100", 312.0),
    (r"L40S", 362.0),
    (r"L40\b", 181.0),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
    (r"\bA40\b", 150.0),
]
LOADER_SIDES = (128, 224)  # the gpu and paper scales' input sizes


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name, or None for one not in `PEAK_BF16_TFLOPS`."""
    return next((peak for pattern, peak in PEAK_BF16_TFLOPS if re.search(pattern, device_name, re.IGNORECASE)), None)


def model_flop_utilisation(images_per_s: float, flops_per_image: float, peak: float | None) -> float | None:
    """The share of the peak (TFLOP/s) that `images_per_s` images of `flops_per_image` each achieve."""
    return None if peak is None else images_per_s * flops_per_image / (peak * 1e12)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def loader_rates(folder: Path, device: torch.device, workers: int = 8, micro_batch: int = 64, passes: int = 4,
                 sides: tuple[int, ...] = LOADER_SIDES) -> dict[str, Any]:
    """Images/s of the training inputs of the JPEGs in `folder` (an ImageFolder) at each side in `sides`,
    random-resized crops and flips as the scales train: `device_decode` (the device alone, on micro-batches
    read beforehand), `device_path` (workers reading bytes, the device decoding: what training gets),
    `worker_path` (workers decoding; `per_worker`: its share of one). Each timed after a first batch
    (the workers' start) over `passes` epochs of the files."""
    from vitzoo import data as datasets
    from vitzoo.data.transforms import EncodedSamples, collate_encoded, decode_batch, device_ops

    files = datasets.load_split(str(folder), "train")
    keys = [(epoch, i) for epoch in range(passes) for i in range(len(files))]
    batches = [keys[i : i + micro_batch] for i in range(0, len(keys) - micro_batch + 1, micro_batch)]
    out: dict[str, Any] = {"images": len(files), "workers": workers, "micro_batch": micro_batch, "device": str(device)}
    for side in sides:
        augment = datasets.Augment(random_resized_crop=0.08, hflip=True)
        transformed = datasets.Transformed(files, datasets.build_transform((side, side), augment), seed=0)
        ops = device_ops(transformed.transform)
        encoded = EncodedSamples(transformed, ops)
        ready = [collate_encoded([encoded[k] for k in batch]) for batch in batches]
        decode_batch(ready[0], ops, device)  # warm-up: the decoder's state, the kernels
        _synchronize(device)
        start = time.perf_counter()
        for batch in ready:
            decode_batch(batch, ops, device)
        _synchronize(device)
        rates = {"device_decode": len(ready) * micro_batch / (time.perf_counter() - start)}

        def timed(loader, to_device) -> float:
            iterator = iter(loader)
            to_device(next(iterator))  # the workers' start is not the pipeline's rate
            _synchronize(device)
            began, images = time.perf_counter(), 0
            for batch in iterator:
                images += len(to_device(batch)[1])
            _synchronize(device)
            return images / (time.perf_counter() - began)

        rates["device_path"] = timed(DataLoader(encoded, batch_sampler=batches, num_workers=workers, collate_fn=collate_encoded),
                                     lambda batch: decode_batch(batch, ops, device))
        rates["worker_path"] = timed(DataLoader(transformed, batch_sampler=batches, num_workers=workers,
                                                pin_memory=device.type == "cuda"),
                                     lambda batch: (batch[0].to(device, non_blocking=True), batch[1]))
        rates["worker_path_per_worker"] = rates["worker_path"] / max(workers, 1)
        out[f"{side}px"] = {k: round(v, 1) for k, v in rates.items()}
    return out


VIT_B16 = ("vit_b16", "vit_base_patch16_224", {}, {})  # vitzoo's name, timm's, vitzoo's options, timm's


def training_mfu(device: torch.device, batch: int = 256, reps: int = 10, compile: bool = True, img_size: int = 224,
                 models: tuple[str, str, dict, dict] = VIT_B16) -> dict[str, Any]:
    """A training step of ViT-B/16 (`models`: another pair, for a check on the CPU) at `batch`, in the
    device's half precision (bf16 where native) under autocast, AdamW's fused kernel, vitzoo and timm
    interleaved on the same weights, and each one's images/s, achieved TFLOP/s and model FLOP utilisation."""
    import timm

    import vitzoo
    from benchmarks.speed_timing import Case, converted, interleaved, train_step_fn
    from vitzoo.precision import half_of

    dtype = half_of(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(0)
    vitzoo_name, timm_name, vitzoo_options, timm_options = models
    peer = timm.create_model(timm_name, img_size=img_size, **timm_options)
    ours = converted(peer, Case(vitzoo_name, {}, img_size, vitzoo_options)).to(device)
    peer.to(device)
    flops = float(vitzoo.count_flops(ours.config, backward=True))
    contestants = {"vitzoo": ours, "timm": peer}
    if compile:
        contestants = {name: torch.compile(model) for name, model in contestants.items()}
    steps = {name: train_step_fn(model, batch, img_size, dtype, device, fused=True) for name, model in contestants.items()}
    speeds = interleaved(steps, reps=reps, images=batch, device=device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = peak_tflops(name) if device.type == "cuda" else None
    result: dict[str, Any] = {"device": name, "dtype": str(dtype).replace("torch.", ""), "batch": batch, "img_size": img_size,
                              "compiled": compile, "gflops_per_image": round(flops / 1e9, 2), "peak_bf16_tflops": peak}
    if peak is None:
        result["mfu_note"] = f"no dense bf16 peak is known for {name!r} (benchmarks/gpu_steps.py PEAK_BF16_TFLOPS): no MFU"
    for contestant, speed in speeds.items():
        rate = speed["images_per_s"]
        utilisation = model_flop_utilisation(rate, flops, peak)
        result[contestant] = {"images_per_s": round(rate, 1), "tflops": round(rate * flops / 1e12, 1),
                              "mfu": None if utilisation is None else round(utilisation, 4)}
    return result


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "mfu":
        sys.exit("usage: python -m benchmarks.gpu_steps mfu OUT.json")
    from vitzoo.io import write_text

    write_text(Path(sys.argv[2]), json.dumps(training_mfu(torch.device("cuda", 0)), indent=1) + "\n")
