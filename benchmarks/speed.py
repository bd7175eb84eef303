"""Speed: vitzoo against timm and torchvision on the same weights, shaped like timm's benchmark.py.
A runner per kind of case (inference; a training step with its peak memory), the contestants'
calls interleaved; each case is stored with its machine once measured, and the README (against
the faster eager peer, the matrix-product ceiling, the figure) is written from every record."""

from __future__ import annotations

import copy
import functools
import importlib
import json
import resource
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch._dynamo

import vitzoo
from benchmarks.figures import plt, save
from benchmarks.suite import RESULTS, ResultStore, environment, markdown_image, markdown_table
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
    """GFLOP/s of torch.mm at `shapes` in `dtype`, each shape's best of `reps` (of 100 on a GPU)."""
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
    """One training step (forward, backward, AdamW, fused as `vitzoo train --compile` has it)."""
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
    """The most tensor bytes three steps add at once (CUDA's allocator, the CPU's profiler)."""
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


def case_key(row: dict, quick: bool) -> str:
    key = f"{row['kind']} {row['model']} {row['dtype']} batch {row['batch']}"
    return key + (" quick" if quick else "")


def main(quick: bool = False, out: Path = OUT, device: str = "cpu",
         report_only: bool = False) -> Path:
    """Measure every case (none with `report_only`), then write the README of this device's."""
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


# ---------------------------------------------------------------- the README
# the rows of the table against the faster eager peer (stored probabilities: older records only)
FAST_PATHS = ("vitzoo", "vitzoo+compile", "vitzoo+compile+stored_probabilities", "vitzoo.fast",
              "vitzoo.fast+compile")
MEMORY_NOTE = (
    "`peak memory GB`: the most tensor bytes that training steps add to the weights at once "
    "(gradients, optimizer state, activations; counted by the profiler on the CPU, by the "
    "allocator on CUDA), what the memory ratios above compare; `resident GB`: the process's "
    "resident memory over the same steps, which also counts the C allocator's free heap (two "
    "probes of one contestant differ by up to 8%); `compiler GB`: Inductor's own resident memory "
    "(its code and caches), counted in neither.")
CEILING_NOTE = (
    "torch.mm at the encoder's product shapes (q/k/v, projection, MLP) at each case's batch, in "
    "its precision; `of ceiling` above is a contestant's images/s over the images/s that this "
    "rate would give for the model's FLOPs (forward, or forward and backward), counted as the "
    "paper counts them, every token through every layer: vitzoo's forward computes the last block"
    " for the class token alone (5.6-6.9% fewer FLOPs, `vitzoo.count_flops(config, "
    "computed=True)`), so its share can pass 100%.")
FASTEST_NOTE = (
    "Every peer eager in float32 and in half precision under autocast, its faster one counted; "
    "vitzoo's fast path in the precision it picks on this machine (`vitzoo.fastest`), compiled "
    "where that measured faster (`compile=\"auto\"`, the default; the column *picked* says which); "
    "interleaved in one run.")


def speedup(row: dict, contestant: str) -> tuple[float, str]:
    """Speed of `contestant` over the fastest eager peer, and that peer."""
    peers = {k: v["images_per_s"] for k, v in row["speeds"].items()
             if not k.startswith("vitzoo") and "+" not in k}
    best = max(peers, key=peers.get)
    return row["speeds"][contestant]["images_per_s"] / peers[best], best


def environments(rows: list[dict]) -> str:
    """Each distinct device, CPU (with its flags), threads, torch and commit, with dates."""
    seen: dict[tuple, list[str]] = {}
    for r in rows:
        device = r["device"] + (f" ({r['gpu']})" if r.get("gpu") else "")
        cpu = r["cpu"] + (f", {' '.join(r['cpu_flags'])}" if r.get("cpu_flags") else "")
        seen.setdefault((device, r["threads"], cpu, r["torch"], r["commit"]), []).append(r["date"])
    return "; ".join(
        f"`{d}` ({t} threads, {c}), torch {v}, commit {g}, {min(dates)[:10]}"
        + (f" to {max(dates)[:10]}" if max(dates)[:10] != min(dates)[:10] else "")
        for (d, t, c, v, g), dates in seen.items())


def fastest_table(rows: list[dict]) -> list[str]:
    """Each peer at its best of float32 and half precision, against `for_inference(model)`."""
    fastest, table = [r for r in rows if r["kind"] == "fastest"], []
    for r in fastest:
        rate = {k: v["images_per_s"] for k, v in r["speeds"].items()}
        faster, fast = max(r["peer_best"].values(), key=rate.get), rate["vitzoo.fast()"]
        table.append([r["model"], r["batch"], r["choice"], round(fast, 2), faster,
                      round(rate[faster], 2), f"{fast / rate[faster]:.2f}x",
                      f"{fast / rate['vitzoo float32']:.2f}x"])
    if not table:
        return []
    calls = ", ".join(sorted({f"`{r['call']}`" for r in fastest}))
    return [f"### Each at its fastest: {calls} with no argument\n\n{FASTEST_NOTE}\n\n"
            + markdown_table(["model", "batch", "picked", "vitzoo.fast() images/s", "fastest peer",
                              "its images/s", "over it", "over vitzoo float32"], table)]


def report(rows: list[dict], out: Path) -> str:
    inference = [r for r in rows if r["kind"] == "inference"]
    trainings = [r for r in rows if r["kind"] == "training"]

    def timed(r: dict, name: str, s: dict) -> list:
        return [r["model"], r["dtype"], r["batch"], name, round(s["images_per_s"], 2),
                f"{s['min']:.2f}-{s['max']:.2f}",
                f"{s['images_per_s'] / r['ceiling_images_per_s']:.0%}",
                f"{s['page_faults_per_call']:,}"]

    def gb(r: dict, field: str, name: str) -> str:  # blank where a contestant has none
        return "" if name not in r.get(field, {}) else f"{r[field][name]:.2f}"

    table = [timed(r, name, s) for r in inference for name, s in r["speeds"].items()]
    train_table = [timed(r, name, s) + [round(r["peak_memory_gb"][name], 3),
                                        gb(r, "peak_resident_gb", name),
                                        gb(r, "compiler_memory_gb", name)]
                   for r in trainings for name, s in r["speeds"].items()]
    ceilings = [[r["kind"], r["model"], r["dtype"], r["batch"], round(r["matmul_gflops_per_s"]),
                 round(r["ceiling_images_per_s"], 2)] for r in rows if "matmul_gflops_per_s" in r]
    targets = []
    one_batch = len({r["batch"] for r in inference}) == 1
    for r in (r for r in inference if r["batch"] == 8 or one_batch):
        for name in (n for n in FAST_PATHS if n in r["speeds"]):
            ratio, best = speedup(r, name)
            targets.append([r["model"], r["dtype"], r["batch"], name, best, f"{ratio:.2f}x"])
    for r in trainings:
        for name in (n for n in FAST_PATHS if n in r["speeds"]):
            ratio, best = speedup(r, name)
            memory = r["peak_memory_gb"][name] / max(r["peak_memory_gb"][best], 1e-9)
            targets.append([r["model"] + " (training)", r["dtype"], r["batch"], name, best,
                            f"{ratio:.2f}x, memory {memory:.2f}x"])
    figure(inference, out / "speed.png")
    parity = {r["model"]: r["max_abs_logit_diff"] for r in inference}
    columns = ["model", "dtype", "batch", "contestant", "images/s", "min-max", "of ceiling",
               "page faults/call"]
    return "\n\n".join([
        f"Measured on {environments(rows)}. Every record, with its environment, is in "
        "`results.json`.",
        "### Against the faster eager peer\n\n"
        + markdown_table(["model", "dtype", "batch", "vitzoo", "faster peer", "speed-up"], targets),
        *fastest_table(rows),
        markdown_image("speed.png"),
        "### Inference (images/s, median of interleaved repetitions; share of the matrix-product "
        "ceiling)\n\n" + markdown_table(columns, table),
        "### Training step (forward, backward, AdamW)\n\n"
        + markdown_table(columns + ["peak memory GB", "resident GB", "compiler GB"], train_table)
        + "\n\n" + MEMORY_NOTE,
        "### Matrix-product ceilings of this machine\n\n" + CEILING_NOTE + "\n\n"
        + markdown_table(["kind", "model", "dtype", "batch", "GFLOP/s", "ceiling images/s"],
                         ceilings),
        "Logit parity of the converted weights (max |difference|, float32): " + json.dumps(parity),
    ])


def figure(rows: list[dict], path: Path) -> None:
    pyplot = plt()
    groups = [r for r in rows if r["batch"] == 8] or rows
    fig, axes = pyplot.subplots(1, len(groups), figsize=(4 * len(groups), 3.5), squeeze=False)
    for ax, r in zip(axes[0], groups):
        names = list(r["speeds"])
        ax.bar(range(len(names)), [r["speeds"][n]["images_per_s"] for n in names],
               color=["C0" if n.startswith("vitzoo") else "C7" for n in names])
        ax.axhline(r["ceiling_images_per_s"], color="C3", linestyle="--", label="matmul ceiling")
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"{r['model']} {r['dtype']} batch {r['batch']}", fontsize=9)
        ax.set_ylabel("images/s")
        ax.legend(fontsize=7)
    save(fig, path)
