"""The CPU's fastest precision, measured: the speeds behind `vitzoo.precision`'s rule on a CPU, for
`vitzoo.inference.for_inference(model)` and `vitzoo train --precision auto`.

A GPU says what it computes natively (`vitzoo.precision.gpu_half`). A CPU does not: bf16 runs at 5x
float32's speed on an AMD EPYC with avx512_bf16, at half of it on an Intel Xeon without AMX; fp16 matches
float32 on CPUs with avx512_fp16 and is hundreds of times slower without. So on a CPU the matrix product
that dominates the model's FLOPs, its MLP's first layer at the model's own shape, is timed once in each
precision, and the result kept per machine (CPU model and instruction sets, torch version, threads,
shape) in $VITZOO_CACHE/fastest_precision.json: the measurement (about a second) runs once.
`vitzoo.precision.pick` applies the rule to the speeds.

`VITZOO_CPU_PRECISION=float32` (or bfloat16, float16; bf16, fp16) skips the measurement and takes that
precision on the CPU: for runs that must compute alike on every machine (the test suite sets float32).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import torch
from torch import nn

from vitzoo import precision
from vitzoo.io import cache_dir, write_text
from vitzoo.machine import cpu_flags, cpu_model

PROBE_ROWS = 16  # a first, tiny product: a precision this CPU emulates is found without waiting for it


def mlp_shape(model: nn.Module, batch: int) -> tuple[int, int, int]:
    """(rows, in, out) of the model's largest matrix product per token: its widest linear layer (the MLP's
    first in a ViT) applied to `batch` images' tokens."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("the model has no linear layer to measure the precisions on: pass a dtype")
    widest = max(linears, key=lambda m: m.weight.numel())
    grid = getattr(model, "grid", (14, 14))  # a vitzoo ViT's token grid; ViT-B/16's at 224 px for others
    tokens = grid[0] * grid[1] + 1
    return batch * tokens, widest.in_features, widest.out_features


def time_matmul(rows: int, inner: int, outer: int, dtype: torch.dtype, budget_s: float = 0.15) -> float:
    """GFLOP/s of (rows x inner) @ (inner x outer) in `dtype` on the CPU: the best of repetitions within
    `budget_s` after one warm-up."""
    a, b = torch.randn(rows, inner).to(dtype), torch.randn(inner, outer).to(dtype)
    a @ b
    best, spent = float("inf"), 0.0
    while spent < budget_s or best == float("inf"):
        start = time.perf_counter()
        a @ b
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return 2 * rows * inner * outer / best / 1e9


def measure_cpu(shape: tuple[int, int, int]) -> dict[str, float]:
    """GFLOP/s of the product `shape` in float32, bf16 and fp16 on this CPU. A precision that runs at
    under a quarter of float32's speed on a 16-row product is recorded at that speed, not timed in full."""
    rows, inner, outer = shape
    probe = {dtype: time_matmul(PROBE_ROWS, inner, outer, dtype, budget_s=0.02) for dtype in precision.NAMES}
    # three significant digits: a busy machine's small product can measure under 0.05 GFLOP/s, which one
    # decimal would record as 0
    return {precision.NAMES[dtype]: float(f"{time_matmul(rows, inner, outer, dtype) if probe[dtype] * 4 >= probe[torch.float32] else probe[dtype]:.3g}")
            for dtype in precision.NAMES}


def measured_on(device: torch.device) -> dict[str, Any]:
    """What a speed measured on `device` holds for: the CPU's model, instruction sets and threads (or the
    GPU's name), and torch's version. Part of the key of every remembered measurement."""
    if device.type == "cpu":
        where = {"cpu": cpu_model(), "flags": cpu_flags(), "threads": torch.get_num_threads()}
    else:
        where = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type}
    return {**where, "torch": torch.__version__}


def machine_key(shape: tuple[int, int, int]) -> str:
    return json.dumps({**measured_on(torch.device("cpu")), "shape": list(shape)}, sort_keys=True)


CACHE_NAME = "fastest_precision.json"


def remembered(cache_name: str, key: str, measure: Callable[[], Any], valid: Callable[[Any], bool]) -> Any:
    """What `measure()` gives, kept under `key` in $VITZOO_CACHE/`cache_name`: measured once per machine
    (the key names the machine), then read back. An unreadable cache, or an entry that is not `valid`, is
    measured again and written anew; a read-only cache is only measured."""
    path = cache_dir() / cache_name
    try:
        cached = json.loads(path.read_text())
        if not isinstance(cached, dict):
            cached = {}
    except (OSError, ValueError):  # none yet, or unreadable: measured again and written anew
        cached = {}
    if key in cached and valid(cached[key]):
        return cached[key]
    cached[key] = measure()
    try:
        write_text(path, json.dumps(cached, indent=1, sort_keys=True) + "\n")
    except OSError:  # a read-only home: the choice still holds, measured again next time
        pass
    return cached[key]


def measured_cpu(shape: tuple[int, int, int]) -> dict[str, float]:
    """`measure_cpu(shape)`, from the cache where this machine measured it before."""
    return remembered(CACHE_NAME, machine_key(shape), lambda: measure_cpu(shape), valid=lambda speeds: isinstance(speeds, dict))


def fastest_precision(model: nn.Module, device: torch.device | str, batch: int = 8, training: bool = False) -> precision.Choice:
    """The precision to compute `model` in on `device` (`vitzoo.precision.choose`), on a CPU from the
    speeds of the model's MLP product at `batch` images. In inference every precision is a candidate; in
    training (autocast) bf16 and float32 on the CPU, as autocast has no fp16 there."""
    return precision.choose(device, training, lambda: measured_cpu(mlp_shape(model, batch)))


__all__ = ["fastest_precision", "measure_cpu", "measured_cpu", "mlp_shape", "remembered"]
