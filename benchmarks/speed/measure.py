"""Measuring the speed benchmark's cases: inference and a training step of every contestant, in
float32 and bf16, and inference with each contestant at its own fastest precision, each case's records
stored as soon as it is measured; `main` measures the chosen
kinds and writes the report of every stored record."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Callable

import torch
import torch._dynamo

import vitzoo
from benchmarks.machine import environment
from benchmarks.speed.cases import (
    STORED_PROBABILITIES,
    Case,
    cases,
    check_parity,
    compiled_training_step,
    converted,
    precisions,
    train_step_fn,
)
from benchmarks.speed.memory import peak_memory_gb
from benchmarks.speed.report import report
from benchmarks.speed.timing import fresh_compiler, interleaved, matmul_ceiling, product_shapes, sdpa_backends
from benchmarks.suite import RESULTS, ResultStore
from vitzoo.inference import compile_for_inference, compile_for_training, for_inference
from vitzoo.io import write_text
from vitzoo.precision import autocast

OUT = RESULTS / "speed"


def inference(case: Case, batches: list[int], reps: int, compile_at: int | None, device: torch.device) -> list[dict]:
    torch.manual_seed(0)
    peers = {lib: build().eval() for lib, build in case.peers.items()}
    # vitzoo holds the first peer's weights; every peer's own weights are checked through a converted copy
    model = converted(next(iter(peers.values())), case).eval()
    x1 = torch.randn(1, 3, case.img_size, case.img_size)
    parity = {lib: check_parity(peer, converted(peer, case), x1) for lib, peer in peers.items()}
    gflops = vitzoo.count_flops(model.config) / 1e9  # one image's forward pass
    model.to(device)
    for peer in peers.values():
        peer.to(device)
    rows = []
    for dtype_name, dtype in precisions(device).items():
        # the weights cast once (for_inference converts its model in place: a copy of its own)
        fast = for_inference(copy.deepcopy(model), dtype, compile=False) if dtype is not None else None
        for batch in batches:
            ceiling = matmul_ceiling(product_shapes(model, batch), dtype, reps, device)
            x = torch.randn(batch, 3, case.img_size, case.img_size, device=device)

            def runner(m, kernel=contextlib.nullcontext, mixed=dtype):
                def run():
                    with torch.inference_mode(), autocast(device, mixed), kernel():
                        m(x)
                return run

            contestants = {"vitzoo": runner(model), **{lib: runner(peer) for lib, peer in peers.items()}}
            if fast is not None:  # no autocast: its weights and activations are already in `dtype`
                contestants["vitzoo.fast"] = runner(fast, mixed=None)
            if batch == compile_at:
                fresh_compiler()
                contestants["vitzoo+compile"] = runner(compile_for_inference(model, x, autocast=dtype))
                if dtype is not None:
                    compiled = for_inference(copy.deepcopy(model), dtype, compile=True)
                    contestants["vitzoo.fast+compile"] = runner(compiled, mixed=None)
                for lib, peer in peers.items():
                    contestants[f"{lib}+compile"] = runner(compile_for_inference(peer, x, autocast=dtype))
                for name, kernel in sdpa_backends(device).items():
                    contestants[f"vitzoo[{name}]"] = runner(model, kernel)
            speeds = interleaved(usable(contestants), reps, batch, device)
            rows.append({"kind": "inference", "model": case.vitzoo_name, "dtype": dtype_name, "batch": batch,
                         "img_size": case.img_size, "gflops_per_image": gflops, "matmul_gflops_per_s": ceiling,
                         "ceiling_images_per_s": ceiling / gflops, "speeds": speeds, "max_abs_logit_diff": parity})
            print(f"  inference {case.vitzoo_name} {dtype_name} batch {batch}: "
                  + ", ".join(f"{k} {v['images_per_s']:.2f}" for k, v in speeds.items()), flush=True)
    return rows


def at_their_fastest(case: Case, batch: int, reps: int, device: torch.device) -> list[dict]:
    """Each contestant at its own fastest: every peer eager in float32 and in its device's half precision
    under autocast, vitzoo eager in float32, and `vitzoo.inference.for_inference(model)` with no
    argument (the precision `vitzoo.precision.fastest` picks for this device, eager), interleaved in
    one run."""
    torch.manual_seed(0)
    peers = {lib: build().eval().to(device) for lib, build in case.peers.items()}
    model = converted(next(iter(peers.values())).cpu(), case).eval().to(device)
    for peer in peers.values():
        peer.to(device)
    fast = for_inference(copy.deepcopy(model))
    x = torch.randn(batch, 3, case.img_size, case.img_size, device=device)

    def runner(m, mixed=None):
        def run():
            with torch.inference_mode(), autocast(device, mixed):
                m(x)
        return run

    contestants = {"vitzoo float32": runner(model), "vitzoo.fast()": runner(fast)}
    for dtype_name, dtype in precisions(device).items():
        contestants.update({f"{lib} {dtype_name}": runner(peer, dtype) for lib, peer in peers.items()})
    speeds = interleaved(contestants, reps, batch, device)
    best = {lib: max((n for n in speeds if n.startswith(lib + " ")), key=lambda n: speeds[n]["images_per_s"])
            for lib in peers}
    print(f"  fastest {case.vitzoo_name} batch {batch} ({fast.describe()}): "
          + ", ".join(f"{k} {v['images_per_s']:.2f}" for k, v in speeds.items()), flush=True)
    return [{"kind": "fastest", "model": case.vitzoo_name, "dtype": "each its fastest", "batch": batch,
             "img_size": case.img_size, "speeds": speeds, "peer_best": best, "choice": fast.describe(),
             "choice_dtype": str(fast.dtype).replace("torch.", "")}]


def usable(contestants: dict[str, Callable[[], None]]) -> dict[str, Callable[[], None]]:
    """The contestants that run: an attention kernel that this GPU, dtype or shape does not support
    raises at once; it is left out of the table, saying so."""
    kept = {}
    for name, fn in contestants.items():
        try:
            fn()
            kept[name] = fn
        except RuntimeError as exc:
            if "[" not in name:  # only the optional kernel variants may be missing
                raise
            print(f"  {name}: not available here ({str(exc).splitlines()[0]})", flush=True)
    return kept


def training(case_index: int, case: Case, batch: int, reps: int, quick: bool, compiled: bool, device: torch.device) -> list[dict]:
    torch.manual_seed(0)
    peers = {lib: build().to(device) for lib, build in case.peers.items()}
    model = converted(next(iter(peers.values())), case).to(device)
    gflops = vitzoo.count_flops(model.config, backward=True) / 1e9  # one image's forward and backward
    rows = []
    for dtype_name, dtype in precisions(device).items():
        ceiling = matmul_ceiling(product_shapes(model, batch), dtype, reps, device)
        contestants = {"vitzoo": model, **peers}
        if compiled:  # (the peers are compiled for inference only: compiling the training step is slow here)
            fresh_compiler()
            contestants["vitzoo+compile"] = compile_for_training(model)
            if dtype is not None and device.type == "cpu":  # where storing the probabilities changes the kernel
                stored = copy.deepcopy(model)
                stored.set_attention_probabilities_stored(True)
                contestants[STORED_PROBABILITIES] = compile_for_training(stored)
        steps = {name: train_step_fn(m, batch, case.img_size, dtype, device, fused=compiled_training_step(name))
                 for name, m in contestants.items()}
        speeds = interleaved(steps, reps, batch, device)
        probes = {name: peak_memory_gb(case_index, name, batch, dtype_name, quick, device) for name in contestants}
        memory = {name: p["peak_gb"] for name, p in probes.items()}
        resident = {name: p["resident_gb"] for name, p in probes.items()}
        compiler = {name: p["compiler_gb"] for name, p in probes.items() if compiled_training_step(name)}
        rows.append({"kind": "training", "model": case.vitzoo_name, "dtype": dtype_name, "batch": batch,
                     "img_size": case.img_size, "gflops_per_image": gflops, "matmul_gflops_per_s": ceiling,
                     "ceiling_images_per_s": ceiling / gflops, "speeds": speeds, "peak_memory_gb": memory,
                     "peak_resident_gb": resident, "compiler_memory_gb": compiler})
        print(f"  training {case.vitzoo_name} {dtype_name} batch {batch}: "
              + ", ".join(f"{k} {v['images_per_s']:.2f}" for k, v in speeds.items()), flush=True)
    return rows


def case_key(row: dict, quick: bool) -> str:
    return f"{row['kind']} {row['model']} {row['dtype']} batch {row['batch']}" + (" quick" if quick else "")


def main(quick: bool = False, out: Path = OUT, device: str = "cpu",
         kinds: tuple[str, ...] = ("inference", "training", "fastest")) -> Path:
    """Measure the cases of `kinds` (both by default; the others keep their stored records) and write
    the report of every stored record."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the speed benchmark runs on cpu or cuda, not {device.type!r}")
    reps = 3 if quick else 7
    batches = [2] if quick else [1, 8, 32]
    plan = cases(quick)
    # the ablations' store: one record per case, keyed by what it measures, each with its environment
    # (device, torch, threads, CPU model, commit, date); a case measured again replaces its record
    store = ResultStore(out)

    def save(rows: list[dict]) -> None:  # after every case, so that a failure later keeps what was measured
        env = environment(str(device))
        for row in rows:
            store.add({"key": case_key(row, quick), "quick": quick, **row, **env})

    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):  # never time an eager fallback as compiled
        for case in plan["inference"] if "inference" in kinds else []:
            save(inference(case, batches, reps, None if quick else 8, device))
        for case in plan["inference"] if "fastest" in kinds else []:
            save(at_their_fastest(case, 2 if quick else 8, reps, device))
        for i, case in enumerate(plan["training"] if "training" in kinds else []):
            batch = 2 if quick else (16 if case.vitzoo_name == "vit_s16" else 4) * (8 if device.type == "cuda" else 1)
            save(training(i, case, batch, reps, quick, not quick, device))
    rows = [r for r in store.runs if r.get("quick", False) == quick and r["device"] == str(device)]
    write_text(out / "README.md", "# Speed\n\n" + report(rows, out) + "\n")
    return out

