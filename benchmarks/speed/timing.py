"""How the speed benchmark keeps a timing fair: repetitions of all contestants interleaved in one
process, the order rotated, the device synchronised, minor page faults counted; the matrix-product
ceiling a contestant's speed is read against; a fresh compiler per case; CUDA's attention kernels."""

from __future__ import annotations

import contextlib
import resource
import statistics
import time
from typing import Callable

import torch
import torch._dynamo


def fresh_compiler() -> None:
    """Forget the graphs compiled for earlier cases before a case compiles its own (two or three of
    `VisionTransformer.forward`). Dynamo keeps at most `recompile_limit` (8) graphs of one Python
    function across every model of the process and, past it, runs the function eagerly without a
    word: a whole run compiles vitzoo's forward 10 times, and until this reset the last contestants
    measured as compiled ran eagerly. `main` also makes reaching the limit an error."""
    torch._dynamo.reset()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a timing covers it (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sdpa_backends(device: torch.device) -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    """On CUDA, scaled_dot_product_attention's kernels one at a time (flash, memory-efficient, cuDNN,
    math), so that the table shows what each gives; elsewhere none (the CPU has one fused kernel)."""
    if device.type != "cuda":
        return {}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return {name: (lambda b=backend: sdpa_kernel([b])) for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION), ("mem_efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH))}


def interleaved(fns: dict[str, Callable[[], None]], reps: int, images: int, device: torch.device) -> dict[str, dict]:
    """Images/s of each function, repetitions interleaved; one warm-up call each first.

    The order rotates by one contestant every repetition, so that none always runs right after the same
    other one: the C allocator's heap is shared, and a contestant that follows one which left it trimmed
    pays for faulting its memory back in (a ViT-S/16 training step after a compiled one faulted in 72k
    pages instead of 22k, and ran 3% slower). The minor page faults of each call are recorded.
    """
    for fn in fns.values():
        fn()
    synchronize(device)
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in fns}
    faulted: dict[str, int] = dict.fromkeys(fns, 0)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            before = minor_page_faults()
            start = time.perf_counter()
            fns[name]()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
            faulted[name] += minor_page_faults() - before
    return {
        name: {"images_per_s": images / statistics.median(t), "min": images / max(t), "max": images / min(t), "reps": len(t),
               "page_faults_per_call": faulted[name] // len(t)}
        for name, t in times.items()
    }


def minor_page_faults() -> int:
    """Minor page faults of this process so far: memory the kernel had to map (and zero) on first touch."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


GPU_PRODUCTS = 100  # products timed together on a GPU, where one takes microseconds


def product_shapes(model: torch.nn.Module, batch: int) -> list[tuple[int, int, int]]:
    """(rows, inputs, outputs) of each matrix product of an encoder block at `batch`: q/k/v, the
    attention's projection, the MLP's two layers (about 95% of ViT-B/16's FLOPs; the hybrid's ResNet
    and the attention's own T x T products are not among them)."""
    config = model.config
    rows = batch * (model.grid[0] * model.grid[1] + model.num_prefix_tokens)
    d, mlp = config.embed_dim, config.mlp_dim
    return [(rows, d, 3 * d), (rows, d, d), (rows, d, mlp), (rows, mlp, d)]


def matmul_ceiling(shapes: list[tuple[int, int, int]], dtype: torch.dtype | None, reps: int, device: torch.device) -> float:
    """GFLOP/s that torch.mm reaches over `shapes` in `dtype` (float32 for None): the best time of each
    over `reps`, summed, as a block of the model would spend them."""
    flops = seconds = 0.0
    for rows, inputs, outputs in shapes:
        a = torch.randn(rows, inputs, device=device, dtype=dtype or torch.float32)
        b = torch.randn(inputs, outputs, device=device, dtype=dtype or torch.float32)
        torch.mm(a, b)
        if device.type == "cuda":
            seconds += min(_gpu_seconds_per_product(a, b, GPU_PRODUCTS, device) for _ in range(reps))
        else:
            seconds += min(_timed(lambda: torch.mm(a, b), device) for _ in range(reps))
        flops += 2 * rows * inputs * outputs
    return flops / seconds / 1e9


def _gpu_seconds_per_product(a: torch.Tensor, b: torch.Tensor, products: int, device: torch.device) -> float:
    """Seconds per product of `products` back-to-back products between two CUDA events: the GPU's own
    clock, with no host synchronisation (which costs more than one product) inside the interval."""
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(products):
            torch.mm(a, b)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / products


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


