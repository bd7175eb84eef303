"""The peak memory a training step adds to the weights, in a fresh process per contestant (`python -m
benchmarks.speed --probe ...`), so that no contestant inherits another's heap; a compiled contestant's
compiler memory is measured apart."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch

from benchmarks.speed.cases import DTYPES, STORED_PROBABILITIES, cases, compiled_training_step, converted, train_step_fn
from benchmarks.speed.timing import synchronize
from benchmarks.suite import peak_memory_growth_gb, resident_memory_gb
from vitzoo.inference import compile_for_training
from vitzoo.precision import autocast


def peak_memory_gb(case_index: int, contestant: str, batch: int, dtype_name: str, quick: bool, device: torch.device) -> dict:
    """Peak memory that training steps add, in a fresh process per contestant, so that no contestant
    inherits another's: {"peak_gb": tensor bytes, "resident_gb": the process's resident memory,
    "compiler_gb": the host memory of the compiler itself (zero for eager contestants)}."""
    cmd = [sys.executable, "-m", "benchmarks.speed", "--probe", str(case_index), contestant, str(batch), dtype_name,
           "--device", str(device)]
    if quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    if out.returncode != 0:
        raise RuntimeError(f"the memory probe of {contestant} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe(case_index: int, contestant: str, batch: int, dtype_name: str, quick: bool, device: torch.device) -> None:
    case = cases(quick)["training"][case_index]
    torch.manual_seed(0)
    lib = contestant.split("+")[0]
    peer = next(iter(case.peers.values()))()
    model = (converted(peer, case) if lib == "vitzoo" else case.peers[lib]()).to(device)
    del peer
    fast = compiled_training_step(contestant)
    if contestant == STORED_PROBABILITIES:
        model.set_attention_probabilities_stored(True)
    if fast:
        model = compile_for_training(model)
    # One forward and backward pass outside the measurement: a compiled model is compiled there, and
    # what the compiler keeps (Inductor's code, the generated kernels: about 0.1 GB resident, whatever
    # the batch) is reported apart, as it is not memory that training adds
    release_freed_memory()
    held = resident_memory_gb()
    warm_up(model, batch, case.img_size, DTYPES[dtype_name], device)
    compiler_gb = resident_memory_gb() - held if fast else 0.0
    step = train_step_fn(model, batch, case.img_size, DTYPES[dtype_name], device, fused=fast)
    # What training adds to the model's weights: gradients, optimizer state and the activations of a
    # step, over three steps (the first allocates the optimizer state). Counted in tensor bytes, which
    # do not depend on the allocator's whims: the CUDA allocator's count, or on the CPU the profiler's
    # record of every allocation and release. The resident memory's peak is recorded beside it (it
    # also counts the C allocator's free heap: two probes of one contestant differ by up to 8%).
    before = resident_memory_gb()
    if device.type == "cuda":
        allocated = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        recorder = contextlib.nullcontext()
    else:
        from torch.profiler import ProfilerActivity, profile

        recorder = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with recorder as prof:
        resident = peak_memory_growth_gb(lambda: three_steps(step, device), since_gb=before)
    if device.type == "cuda":
        peak = (torch.cuda.max_memory_allocated(device) - allocated) / 2**30
    else:
        peak = peak_allocated_bytes(prof) / 2**30
    print(json.dumps({"peak_gb": peak, "resident_gb": resident, "compiler_gb": compiler_gb}))


def three_steps(step: Callable[[], None], device: torch.device) -> None:
    for _ in range(3):
        step()
    synchronize(device)


def peak_allocated_bytes(prof) -> int:
    """The most bytes held at once by the tensors allocated while `prof` recorded (profile_memory=True),
    from its allocation and release events in the order they happened."""
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for event in events:
        held += event.nbytes()  # negative for a release
        peak = max(peak, held)
    return peak


def warm_up(model: torch.nn.Module, batch: int, img_size: int, dtype: torch.dtype | None, device: torch.device) -> None:
    """A forward and backward pass of `model` whose memory is given back (`release_freed_memory`), so
    that the memory held afterwards is what the pass left behind (compiled code), not the heap it grew to."""
    model.train()
    with autocast(device, dtype):
        model(torch.randn(batch, 3, img_size, img_size, device=device)).float().sum().backward()
    model.zero_grad(set_to_none=True)
    synchronize(device)
    release_freed_memory(device)


def release_freed_memory(device: torch.device | None = None) -> None:
    """Give freed memory back to the system: Python's garbage, CUDA's cached blocks, and the C
    allocator's free heap (glibc's malloc_trim), so that resident memory counts what is in use."""
    gc.collect()
    if device is not None and device.type == "cuda":
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the heap stays as it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)


