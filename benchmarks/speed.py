"""Speed: vitzoo against timm and torchvision on the same weights, shaped like timm's benchmark.py.

    python -m benchmarks speed [--quick] [--device cpu|cuda|auto] [--report-only]

A runner per kind of case: inference, and a training step with its peak memory; the contestants'
calls interleaved, the device synchronised. Each case is stored with its machine as soon as it is
measured; the README is written from every record (speed_report.py).
"""

from __future__ import annotations

import copy
import functools
import importlib
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch._dynamo

import vitzoo
from benchmarks.machine import environment
from benchmarks.speed_report import report
from benchmarks.suite import RESULTS, ResultStore
from vitzoo.inference import compile_for_inference, compile_for_training, for_inference
from vitzoo.io import write_text
from vitzoo.model import choose_attention
from vitzoo.precision import FIXED, autocast, half_of

OUT = RESULTS / "speed"
# the records' names of vitzoo.precision's dtypes ("float32" where --precision says "fp32")
DTYPES = {"float32" if name == "fp32" else name: dtype for name, dtype in FIXED.items()}


# ---------------------------------------------------------------- the cases
def timm(name: str, **options) -> Callable[[], torch.nn.Module]:
    return lambda: importlib.import_module("timm").create_model(name, **options)


def torchvision(name: str, **options) -> Callable[[], torch.nn.Module]:
    return lambda: getattr(importlib.import_module("torchvision.models"), name)(**options)


@dataclass
class Case:
    model: str  # vitzoo's name
    peers: dict[str, Callable[[], torch.nn.Module]]  # library -> builder of the peer model
    img_size: int = 224
    options: dict = field(default_factory=dict)  # vitzoo's options


VIT_B16 = Case("vit_b16", {"timm": timm("vit_base_patch16_224"),
                           "torchvision": torchvision("vit_b_16")})
VIT_S16 = Case("vit_s16", {"timm": timm("vit_small_patch16_224")})
# timm's default tag for this hybrid has no classifier: ask for ImageNet's 1000 classes
HYBRID = Case("vit_b16_hybrid", {"timm": timm("vit_base_r50_s16_224", num_classes=1000)})
CASES = {"inference": [VIT_B16, HYBRID], "training": [VIT_S16, HYBRID]}
TINY = Case("vit_ti16", {  # the quick runs' stand-in, of the same structure
    "timm": timm("vit_tiny_patch16_224", depth=2, img_size=64),
    "torchvision": torchvision("VisionTransformer", image_size=64, patch_size=16, num_layers=2,
                               num_heads=3, hidden_dim=192, mlp_dim=768)},
    64, dict(embed_dim=192, depth=2, num_heads=3))


def precisions(device: torch.device) -> dict[str, torch.dtype | None]:
    """float32 and the device's half precision (bf16, or fp16 on a GPU that only emulates bf16)."""
    return {name: dtype for name, dtype in DTYPES.items() if dtype in (None, half_of(device))}


def models(case: Case, device: torch.device, parity: bool = False) -> tuple:
    """vitzoo on the first peer's weights (read through its converters), the peers, and with
    `parity` the largest logit difference of each peer from vitzoo on its weights (float32)."""
    def converted(peer):
        return vitzoo.create(case.model, pretrained=peer.state_dict(), img_size=case.img_size,
                             **case.options).eval()

    torch.manual_seed(0)
    peers = {lib: build().eval() for lib, build in case.peers.items()}
    x = torch.randn(1, 3, case.img_size, case.img_size)
    with torch.inference_mode():
        diffs = {lib: (p(x) - converted(p)(x)).abs().max().item()
                 for lib, p in peers.items()} if parity else {}
    model = converted(next(iter(peers.values()))).to(device)
    return model, {lib: p.to(device) for lib, p in peers.items()}, diffs


# ---------------------------------------------------------------- a fair timing
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":  # CUDA runs asynchronously: a timing must cover the queued work
        torch.cuda.synchronize(device)


def interleaved(fns: dict[str, Callable[[], None]], reps: int, images: int,
                device: torch.device) -> dict[str, dict]:
    """Images/s and minor page faults per call of each function, after a warm-up call each. The
    order rotates: a contestant that always followed the same one would pay for its freed heap."""
    for fn in fns.values():
        fn()
    synchronize(device)
    names, times, faults = list(fns), {name: [] for name in fns}, dict.fromkeys(fns, 0)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            before, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            fns[name]()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
            faults[name] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return {name: {"images_per_s": images / statistics.median(t), "min": images / max(t),
                   "max": images / min(t), "reps": reps,
                   "page_faults_per_call": faults[name] // reps} for name, t in times.items()}


def runner(model, x: torch.Tensor, dtype: torch.dtype | None) -> Callable[[], None]:
    def run():
        with torch.inference_mode(), autocast(x.device, dtype):
            model(x)
    return run


def matmul_ceiling(shapes: list[tuple[int, int, int]], dtype: torch.dtype | None, reps: int,
                   device: torch.device) -> float:
    """GFLOP/s of torch.mm at `shapes` in `dtype` (None: float32), each shape's best of `reps`
    (on a GPU, of 100 products: one takes microseconds)."""
    calls, flops, seconds = 100 if device.type == "cuda" else 1, 0.0, 0.0
    for rows, inputs, outputs in shapes:
        a = torch.randn(rows, inputs, device=device, dtype=dtype or torch.float32)
        b = torch.randn(inputs, outputs, device=device, dtype=dtype or torch.float32)
        products = interleaved({"mm": lambda: [torch.mm(a, b) for _ in range(calls)]}, reps, calls,
                               device)
        flops, seconds = flops + 2 * rows * inputs * outputs, seconds + 1 / products["mm"]["max"]
    return flops / seconds / 1e9


def train_step(model, batch: int, img_size: int, dtype: torch.dtype | None,
               device: torch.device, fused: bool = False) -> Callable[[], None]:
    """One training step (forward, backward, AdamW); `fused`: AdamW's fused kernel, as `vitzoo
    train --compile` has it; the eager contestants take PyTorch's default."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if fused else {}))
    x = torch.randn(batch, 3, img_size, img_size, device=device)
    y = torch.randint(0, 1000, (batch,), device=device)

    def step():
        with autocast(device, dtype):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def peak_memory_gb(step: Callable[[], None], device: torch.device) -> float:
    """The most tensor bytes that three steps (of a fresh optimizer) add at once: the allocator's
    count on CUDA, the profiler's allocation and release events in order on the CPU."""
    if device.type == "cuda":
        synchronize(device)
        held = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(3):
            step()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - held) / 2**30
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
        for _ in range(3):
            step()
    events = [e for e in recorded.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()  # negative for a release
        peak = max(peak, held)
    return peak / 2**30


# ---------------------------------------------------------------- the runners
def row(kind: str, case: Case, dtype: str, batch: int, speeds: dict, **figures) -> dict:
    print(f"  {kind} {case.model} {dtype} batch {batch}: "
          + ", ".join(f"{k} {v['images_per_s']:.2f}" for k, v in speeds.items()), flush=True)
    return {"kind": kind, "model": case.model, "dtype": dtype, "batch": batch,
            "img_size": case.img_size, "speeds": speeds, **figures}


def ceiling(model, batch: int, dtype, reps: int, device: torch.device, gflops: float) -> dict:
    """The matmul ceiling at an encoder block's products: q/k/v, projection, the MLP's two."""
    rows = batch * (model.grid[0] * model.grid[1] + model.num_prefix_tokens)
    d, mlp = model.config.embed_dim, model.config.mlp_dim
    shapes = [(rows, d, 3 * d), (rows, d, d), (rows, d, mlp), (rows, mlp, d)]
    rate = matmul_ceiling(shapes, dtype, reps, device)
    return {"gflops_per_image": gflops, "matmul_gflops_per_s": rate,
            "ceiling_images_per_s": rate / gflops}


def inference(case: Case, batches: list[int], reps: int, device: torch.device,
              dtypes: dict | None = None, compile_at: int | None = None) -> list[dict]:
    model, peers, parity = models(case, device, parity=True)
    gflops, rows = vitzoo.count_flops(model.config) / 1e9, []  # one image's forward pass
    for name, dtype in (dtypes or precisions(device)).items():
        choose_attention(model, device, dtype)  # the kernel of the precision, as vitzoo's own
        # weights cast once, no autocast (for_inference converts in place: a copy of its own)
        fast = None if dtype is None else for_inference(copy.deepcopy(model), dtype)
        for batch in batches:
            x = torch.randn(batch, 3, case.img_size, case.img_size, device=device)
            runs = {"vitzoo": runner(model, x, dtype),
                    **{lib: runner(peer, x, dtype) for lib, peer in peers.items()},
                    **({} if fast is None else {"vitzoo.fast": runner(fast, x, None)})}
            if batch == compile_at:
                torch._dynamo.reset()  # Dynamo keeps a few graphs per function, across models
                for lib, m in {"vitzoo": model, **peers}.items():
                    runs[f"{lib}+compile"] = runner(compile_for_inference(m, x, dtype), x, dtype)
                if fast is not None:
                    fast_compiled = for_inference(copy.deepcopy(model), dtype, compile=True)
                    runs["vitzoo.fast+compile"] = runner(fast_compiled, x, None)
            rows.append(row("inference", case, name, batch, interleaved(runs, reps, batch, device),
                            **ceiling(model, batch, dtype, reps, device, gflops),
                            max_abs_logit_diff=parity))
    return rows


def training(case: Case, batch: int, reps: int, device: torch.device, dtypes: dict | None = None,
             compile: bool = False) -> list[dict]:
    model, peers, _ = models(case, device)
    gflops, rows = vitzoo.count_flops(model.config, backward=True) / 1e9, []
    for name, dtype in (dtypes or precisions(device)).items():
        choose_attention(model, device, dtype)  # the kernel of the precision, as the trainer's
        contestants = {"vitzoo": model, **peers}
        if compile:  # vitzoo alone: the peers' compiled steps were slow on the CPU
            torch._dynamo.reset()
            contestants["vitzoo+compile"] = compile_for_training(model)
        steps = {n: functools.partial(train_step, m, batch, case.img_size, dtype, device,
                                      fused="+compile" in n) for n, m in contestants.items()}
        speeds = interleaved({n: make() for n, make in steps.items()}, reps, batch, device)
        rows.append(row("training", case, name, batch, speeds,
                        **ceiling(model, batch, dtype, reps, device, gflops),
                        peak_memory_gb={n: peak_memory_gb(make(), device)
                                        for n, make in steps.items()}))
    return rows


# ---------------------------------------------------------------- the command
def case_key(row: dict, quick: bool) -> str:
    key = f"{row['kind']} {row['model']} {row['dtype']} batch {row['batch']}"
    return key + (" quick" if quick else "")


def main(quick: bool = False, out: Path = OUT, device: str = "cpu",
         report_only: bool = False) -> Path:
    """Measure every case (none with `report_only`), each stored as soon as it is measured, and
    write the report of every record of this device."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu")
                          if device == "auto" else device)
    reps, batches, cases = (3, [2], {"inference": [TINY], "training": [TINY]}) if quick else (
        7, [1, 8, 32], CASES)
    store = ResultStore(out)

    def save(rows: list[dict]) -> None:
        for row in rows:
            store.add({"key": case_key(row, quick), "quick": quick, **row,
                       **environment(str(device))})

    # past Dynamo's recompile limit a function runs eagerly without a word: an error instead
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for case in [] if report_only else cases["inference"]:
            save(inference(case, batches, reps, device, compile_at=None if quick else 8))
        for case in [] if report_only else cases["training"]:
            batch = 2 if quick else 16 if case.model == "vit_s16" else 4
            batch *= 8 if device.type == "cuda" else 1
            save(training(case, batch, reps, device, compile=not quick))
    rows = [r for r in store.runs if r.get("quick", False) == quick and r["device"] == str(device)]
    write_text(out / "README.md", "# Speed\n\n" + report(rows, out) + "\n")
    return out
