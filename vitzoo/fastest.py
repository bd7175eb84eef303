"""The CPU's fastest precision, measured: the speeds behind `vitzoo.precision`'s rule on a CPU, for
`vitzoo.inference.for_inference(model)` and `vitzoo train --precision auto`.

A GPU says what it computes natively (`vitzoo.precision.gpu_half`). A CPU does not: bf16 runs at 5x
float32's speed on an AMD EPYC with avx512_bf16, at half of it on an Intel Xeon without AMX; fp16 matches
float32 on CPUs with avx512_fp16 and is hundreds of times slower without. So on a CPU the matrix product
that dominates the model's FLOPs, its MLP's first layer at the model's own shape, is timed once in each
precision, and the result kept per machine (CPU model and instruction sets, torch version, threads,
shape) in $VITZOO_CACHE/fastest_precision.json: the measurement (about two seconds) runs once.
`vitzoo.precision.pick` applies the rule to the speeds.

Not blindly (`vitzoo.measurements`): the measurement is repeated and kept only where its repeats agree,
and a kept choice is checked at each use by timing the product once in the chosen precision and in its
rival (float32 against a chosen half precision; against float32, a half precision that is not emulated):
where the choice turns out slower, the machine is measured again.

`VITZOO_CPU_PRECISION=float32` (or bfloat16, float16; bf16, fp16) skips the measurement and takes that
precision on the CPU: for runs that must compute alike on every machine (the test suite sets float32).
"""

from __future__ import annotations

import json
import time

import torch
from torch import nn

from vitzoo import precision
from vitzoo.measurements import MAX_SPREAD, measured_on, remembered, spread

PROBE_ROWS = 16  # a first, tiny product: a precision this CPU emulates is found without waiting for it
REPEATS = 2  # timings of each precision, interleaved: their spread decides whether the speeds are kept
CHECK_BUDGET_S = 0.02  # the check of a kept choice at use: one timed product per precision
CACHE_NAME = "fastest_precision.json"


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


def time_matmul(rows: int, inner: int, outer: int, dtype: torch.dtype, budget_s: float = 0.15,
                device: torch.device | str = "cpu") -> float:
    """GFLOP/s of (rows x inner) @ (inner x outer) in `dtype` on `device`: the best of repetitions within
    `budget_s` after one warm-up."""
    device = torch.device(device)
    a = torch.randn(rows, inner, device=device).to(dtype)
    b = torch.randn(inner, outer, device=device).to(dtype)
    a @ b
    best, spent = float("inf"), 0.0
    while spent < budget_s or best == float("inf"):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return 2 * rows * inner * outer / best / 1e9


def measure_cpu(shape: tuple[int, int, int]) -> dict[str, float]:
    """GFLOP/s of the product `shape` in float32, bf16 and fp16 on this CPU, the best of `REPEATS`
    interleaved timings, and their `spread` (the largest of the precisions'). A precision that runs at
    under a quarter of float32's speed on a 16-row product is recorded at that speed, not timed in full."""
    rows, inner, outer = shape
    probe = {dtype: time_matmul(PROBE_ROWS, inner, outer, dtype, budget_s=0.02) for dtype in precision.NAMES}
    timed = [dtype for dtype in precision.NAMES if probe[dtype] * 4 >= probe[torch.float32]]
    repeats: dict[torch.dtype, list[float]] = {dtype: [] for dtype in timed}
    for _ in range(REPEATS):
        for dtype in timed:
            repeats[dtype].append(time_matmul(rows, inner, outer, dtype, budget_s=0.15 / REPEATS))
    speeds = {dtype: max(repeats[dtype]) if dtype in repeats else probe[dtype] for dtype in precision.NAMES}
    # three significant digits: a busy machine's small product can measure under 0.05 GFLOP/s, which one
    # decimal would record as 0
    return {**{precision.NAMES[dtype]: float(f"{speed:.3g}") for dtype, speed in speeds.items()},
            "spread": round(max(spread(times) for times in repeats.values()), 3)}


def machine_key(shape: tuple[int, int, int]) -> str:
    return json.dumps({**measured_on(torch.device("cpu")), "shape": list(shape)}, sort_keys=True)


def still_holds(speeds: dict[str, float], shape: tuple[int, int, int], candidates: tuple[torch.dtype, ...]) -> bool:
    """Whether the choice kept speeds give still holds on this CPU now: the product timed once in the
    chosen precision and in its rival (float32 for a half precision; for float32 the fastest half precision
    that is not emulated, if any). A chosen half precision that runs slower than float32 no longer holds,
    nor does float32 where a half precision now runs `HALF_MUST_BE` x faster."""
    chosen = precision.pick(speeds, candidates).dtype
    if chosen != torch.float32:
        rival = torch.float32
    else:
        halves = [d for d in candidates if d != torch.float32 and speeds[precision.NAMES[d]] * 4 >= speeds["float32"]]
        if not halves:
            return True
        rival = max(halves, key=lambda d: speeds[precision.NAMES[d]])
    now = {dtype: time_matmul(*shape, dtype, budget_s=CHECK_BUDGET_S) for dtype in (chosen, rival)}
    if chosen != torch.float32:
        return now[chosen] >= now[torch.float32]
    return now[rival] < precision.HALF_MUST_BE * now[torch.float32]


def measured_cpu(shape: tuple[int, int, int], candidates: tuple[torch.dtype, ...] = precision.INFERENCE_DTYPES) -> dict[str, float]:
    """`measure_cpu(shape)`, from the cache where this machine measured it before and the choice among
    `candidates` still holds (`still_holds`); kept only where its repeats agree (`MAX_SPREAD`)."""
    return remembered(CACHE_NAME, machine_key(shape), lambda: measure_cpu(shape),
                      valid=lambda speeds: isinstance(speeds, dict) and set(precision.NAMES.values()) <= set(speeds),
                      trusted=lambda speeds: speeds.get("spread", 0.0) <= MAX_SPREAD,
                      still_holds=lambda speeds: still_holds(speeds, shape, candidates))


def fastest_precision(model: nn.Module, device: torch.device | str, batch: int = 8, training: bool = False) -> precision.Choice:
    """The precision to compute `model` in on `device` (`vitzoo.precision.choose`), on a CPU from the
    speeds of the model's MLP product at `batch` images. In inference every precision is a candidate; in
    training (autocast) bf16 and float32 on the CPU, as autocast has no fp16 there."""
    return precision.choose(device, training, lambda: measured_cpu(mlp_shape(model, batch), precision.candidates(training)))


__all__ = ["fastest_precision", "measure_cpu", "measured_cpu", "mlp_shape", "still_holds", "time_matmul"]
