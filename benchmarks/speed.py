"""Speed: vitzoo against timm and torchvision on the same architecture, weights and inputs.

    python -m benchmarks speed [--quick] [--device cpu|cuda|auto]
    python -m benchmarks.speed [--only inference|training] [--quick] [--device ...]   (one kind of case)

Every peer is built with random weights, vitzoo loads the same weights through its converters (and
its logits are checked against the peer's), and repetitions of all contestants are interleaved in one
process, so that a change of machine load hits all of them alike. Reported: median images/s and the
spread (min-max) over repetitions, float32 and bf16 autocast, inference at batch 1, 8 and 32, a
training step (forward, backward, AdamW), the peak memory training adds to the weights (gradients,
optimizer state, activations: tensor bytes, and resident memory beside them, in a fresh child process
per contestant; for a compiled contestant, the compiler's own memory is measured apart), minor page
faults per call, and each contestant's share of the matrix-product ceiling: the rate torch.mm
reaches, in the same run and precision, at the encoder's own product shapes (q/k/v, projection, the
MLP's two layers at that batch), so that CPUs whose matrix units differ (e.g. 430 vs 835 GFLOP/s in
bf16) can be read side by side. Every record carries the CPU's model, family and instruction-set flags.

Contestants: `vitzoo` (eager), `vitzoo+compile` (`vitzoo.fast`: Inductor with frozen weights for
inference; for training a compiled step with AdamW's fused kernel, as `vitzoo train` has it), in bf16 `vitzoo.fast` (`vitzoo.fast.for_inference`: weights cast
to bf16 once, no autocast) and, at batch 8, `vitzoo.fast+compile` (the same, compiled with frozen
weights), for bf16 training on the CPU `vitzoo+compile+stored_probabilities` (the compiled step of a
model with `set_attention_probabilities_stored()`), and each peer eager; for inference at batch 8 the
peers are also compiled the same way, so that the effect of the compiler and the effect of the implementation can be
told apart. On CUDA the timings synchronise the device, peak memory is the allocator's, and vitzoo
is also timed with each of scaled_dot_product_attention's kernels forced (`vitzoo[flash]`,
`vitzoo[mem_efficient]`, `vitzoo[cudnn]`, `vitzoo[math]`); training batches are 8x larger there.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch._dynamo

import vitzoo
from benchmarks.suite import RESULTS, ResultStore, environment, markdown_table, peak_memory_growth_gb, resident_memory_gb, save_figure
from vitzoo.fast import compile_for_inference, compile_for_training, for_inference
from vitzoo.io import write_text
from vitzoo.precision import autocast

OUT = RESULTS / "speed"
# the compiled training step of a model that stores its attention probabilities (bf16 on the CPU)
STORED_PROBABILITIES = "vitzoo+compile+stored_probabilities"


def compiled_training_step(contestant: str) -> bool:
    """Whether a training contestant is vitzoo's compiled step (with AdamW's fused kernel, as `vitzoo
    train --compile` has it), with or without stored attention probabilities."""
    return contestant.startswith("vitzoo+compile")


DTYPES = {"float32": None, "bf16": torch.bfloat16}


@dataclass
class Case:
    vitzoo_name: str
    peers: dict[str, Callable[[], torch.nn.Module]]  # library -> builder of the peer model
    img_size: int = 224
    options: dict | None = None  # vitzoo options (quick runs use small models)


def timm_model(name: str, **kwargs) -> Callable[[], torch.nn.Module]:
    def build():
        import timm

        return timm.create_model(name, **kwargs)

    return build


def torchvision_model(name: str, **kwargs) -> Callable[[], torch.nn.Module]:
    def build():
        import torchvision

        return getattr(torchvision.models, name)(**kwargs)

    return build


def cases(quick: bool) -> dict[str, list[Case]]:
    if quick:  # small stand-ins with the same structure, so that the test of this script is fast
        small = dict(embed_dim=192, depth=2, num_heads=3)
        vit = Case("vit_ti16", {"timm": timm_model("vit_tiny_patch16_224", depth=2, img_size=64),
                                "torchvision": torchvision_model("VisionTransformer", image_size=64, patch_size=16, num_layers=2,
                                                                 num_heads=3, hidden_dim=192, mlp_dim=768)}, 64, small)
        return {"inference": [vit], "training": [vit]}
    vit_b16 = Case("vit_b16", {"timm": timm_model("vit_base_patch16_224"), "torchvision": torchvision_model("vit_b_16")})
    # (timm's default weights tag for this hybrid has no classifier: ask for ImageNet's 1000 classes)
    hybrid = Case("vit_b16_hybrid", {"timm": timm_model("vit_base_r50_s16_224", num_classes=1000)})
    vit_s16 = Case("vit_s16", {"timm": timm_model("vit_small_patch16_224")})
    return {"inference": [vit_b16, hybrid], "training": [vit_s16, hybrid]}


def converted(peer: torch.nn.Module, case: Case) -> torch.nn.Module:
    """vitzoo holding the peer's weights, read through vitzoo's own converters."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "peer.pth"
        torch.save(peer.state_dict(), path)
        return vitzoo.create(case.vitzoo_name, pretrained=path, img_size=case.img_size, **(case.options or {}))


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


def check_parity(peer, model, x) -> float:
    with torch.inference_mode():
        return (peer.eval()(x) - model.eval()(x)).abs().max().item()


# ------------------------------------------------------------------------------------ inference
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
    for dtype_name, dtype in DTYPES.items():
        # the weights cast once (vitzoo.fast converts its model in place: a copy of its own)
        fast = for_inference(copy.deepcopy(model), dtype) if dtype is not None else None
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
                    compiled = for_inference(copy.deepcopy(model), dtype, compile=True, example=x)
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


# ------------------------------------------------------------------------------------- training
def train_step_fn(model: torch.nn.Module, batch: int, img_size: int, dtype: torch.dtype | None, device: torch.device,
                  fused: bool = False):
    """One training step of `model`; `fused`: AdamW's fused kernel (one pass over every parameter), as
    `vitzoo train` uses it, for the fast path; the eager contestants all take PyTorch's default."""
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


def peak_memory_gb(case_index: int, contestant: str, batch: int, dtype_name: str, quick: bool, device: torch.device) -> dict:
    """Peak memory that training steps add, in a fresh process per contestant, so that no contestant
    inherits another's: {"peak_gb": tensor bytes, "resident_gb": the process's resident memory,
    "compiler_gb": the host memory of the compiler itself (zero for eager contestants)}."""
    cmd = [sys.executable, "-m", "benchmarks.speed", "--probe", str(case_index), contestant, str(batch), dtype_name,
           "--device", str(device)]
    if quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent.parent)
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


def training(case_index: int, case: Case, batch: int, reps: int, quick: bool, compiled: bool, device: torch.device) -> list[dict]:
    torch.manual_seed(0)
    peers = {lib: build().to(device) for lib, build in case.peers.items()}
    model = converted(next(iter(peers.values())), case).to(device)
    gflops = vitzoo.count_flops(model.config, backward=True) / 1e9  # one image's forward and backward
    rows = []
    for dtype_name, dtype in DTYPES.items():
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


# --------------------------------------------------------------------------------------- report
FAST_PATHS = ("vitzoo", "vitzoo+compile", STORED_PROBABILITIES, "vitzoo.fast", "vitzoo.fast+compile")  # the rows of the targets table


def share(speed: dict, row: dict) -> str:
    """A contestant's share of the matrix-product ceiling of its row (records without one: blank)."""
    return f"{speed['images_per_s'] / row['ceiling_images_per_s']:.0%}" if "ceiling_images_per_s" in row else ""


def faults(speed: dict) -> str:
    """Minor page faults per call (records from before they were counted: blank). Thousands of them
    mean that the C allocator handed back fresh pages, whose first touch costs time on the CPU."""
    return f"{speed['page_faults_per_call']:,}" if "page_faults_per_call" in speed else ""


def memory_gb(row: dict, field: str, contestant: str) -> str:
    """A contestant's figure from one of a training row's memory fields (blank where it has none:
    eager contestants have no compiler, older records no resident memory)."""
    gb = row.get(field, {}).get(contestant)
    return "" if gb is None else f"{gb:.2f}"


def speedup(row: dict, contestant: str) -> tuple[float, str]:
    """Speed of `contestant` over the fastest eager peer."""
    peers = {k: v["images_per_s"] for k, v in row["speeds"].items() if not k.startswith("vitzoo") and "+" not in k}
    best = max(peers, key=peers.get)
    return row["speeds"][contestant]["images_per_s"] / peers[best], best


def case_key(row: dict, quick: bool) -> str:
    return f"{row['kind']} {row['model']} {row['dtype']} batch {row['batch']}" + (" quick" if quick else "")


def environments(rows: list[dict]) -> str:
    """Where the rows were measured: each distinct device, CPU (with its flags), threads, torch and
    commit, with dates."""
    seen: dict[tuple, list[str]] = {}
    for r in rows:
        device = r["device"] + (f" ({r['gpu']})" if r.get("gpu") else "")
        cpu = r["cpu"] + (f", {' '.join(r['cpu_flags'])}" if r.get("cpu_flags") else "")
        seen.setdefault((device, r["threads"], cpu, r["torch"], r["commit"]), []).append(r["date"])
    return "; ".join(f"`{d}` ({t} threads, {c}), torch {v}, commit {g}, {min(dates)[:10]}" + (
        f" to {max(dates)[:10]}" if max(dates)[:10] != min(dates)[:10] else "") for (d, t, c, v, g), dates in seen.items())


def report(rows: list[dict], out: Path) -> str:
    inference_rows = [r for r in rows if r["kind"] == "inference"]
    table = []
    for r in inference_rows:
        for name, s in r["speeds"].items():
            table.append([r["model"], r["dtype"], r["batch"], name, round(s["images_per_s"], 2),
                          f"{s['min']:.2f}-{s['max']:.2f}", share(s, r), faults(s)])
    train_table = []
    for r in (r for r in rows if r["kind"] == "training"):
        for name, s in r["speeds"].items():
            train_table.append([r["model"], r["dtype"], r["batch"], name, round(s["images_per_s"], 2),
                                f"{s['min']:.2f}-{s['max']:.2f}", share(s, r), faults(s), round(r["peak_memory_gb"][name], 3),
                                memory_gb(r, "peak_resident_gb", name), memory_gb(r, "compiler_memory_gb", name)])
    ceilings = [[r["kind"], r["model"], r["dtype"], r["batch"], round(r["matmul_gflops_per_s"]),
                 round(r["ceiling_images_per_s"], 2)] for r in rows if "matmul_gflops_per_s" in r]
    targets = []
    for r in inference_rows:
        if r["batch"] == 8 or len({x["batch"] for x in inference_rows}) == 1:
            for name in FAST_PATHS:
                if name in r["speeds"]:
                    ratio, best = speedup(r, name)
                    targets.append([r["model"], r["dtype"], r["batch"], name, best, f"{ratio:.2f}x"])
    for r in (r for r in rows if r["kind"] == "training"):
        for name in (n for n in FAST_PATHS if n in r["speeds"]):
            ratio, best = speedup(r, name)
            mem_ratio = r["peak_memory_gb"][name] / max(r["peak_memory_gb"][best], 1e-9)
            targets.append([r["model"] + " (training)", r["dtype"], r["batch"], name, best, f"{ratio:.2f}x, memory {mem_ratio:.2f}x"])
    figure(inference_rows, out / "speed.png")
    parity = {r["model"]: r["max_abs_logit_diff"] for r in inference_rows}
    return "\n\n".join([
        f"Measured on {environments(rows)}. Every record, with its environment, is in `results.json`.",
        "### Against the faster eager peer\n\n" + markdown_table(["model", "dtype", "batch", "vitzoo", "faster peer", "speed-up"], targets),
        "### Inference (images/s, median of interleaved repetitions; share of the matrix-product ceiling)\n\n"
        + markdown_table(["model", "dtype", "batch", "contestant", "images/s", "min-max", "of ceiling", "page faults/call"], table),
        "### Training step (forward, backward, AdamW)\n\n"
        + markdown_table(["model", "dtype", "batch", "contestant", "images/s", "min-max", "of ceiling", "page faults/call", "peak memory GB",
                           "resident GB", "compiler GB"], train_table)
        + "\n\n`peak memory GB`: the most tensor bytes that training steps add to the weights at once (gradients, "
        "optimizer state, activations; counted by the profiler on the CPU, by the allocator on CUDA), what the "
        "memory ratios above compare; `resident GB`: the process's resident memory over the same steps, which also "
        "counts the C allocator's free heap (two probes of one contestant differ by up to 8%); `compiler GB`: "
        "Inductor's own resident memory (its code and caches), counted in neither.",
        "### Matrix-product ceilings of this machine\n\ntorch.mm at the encoder's product shapes (q/k/v, projection, MLP) at "
        "each case's batch, in its precision; `of ceiling` above is a contestant's images/s over the images/s "
        "that this rate would give for the model's FLOPs (forward, or forward and backward), counted as the paper "
        "counts them, every token through every layer: vitzoo's forward computes the last block for the class token "
        "alone (5.6-6.9% fewer FLOPs, `vitzoo.count_flops(config, computed=True)`), so its share can pass 100%.\n\n"
        + markdown_table(["kind", "model", "dtype", "batch", "GFLOP/s", "ceiling images/s"], ceilings),
        "Logit parity of the converted weights (max |difference|, float32): " + json.dumps(parity),
    ])


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [r for r in rows if r["batch"] == 8] or rows
    fig, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 3.5), squeeze=False)
    for ax, r in zip(axes[0], groups):
        names = list(r["speeds"])
        ax.bar(range(len(names)), [r["speeds"][n]["images_per_s"] for n in names],
               color=["C0" if n.startswith("vitzoo") else "C7" for n in names])
        ax.axhline(r["ceiling_images_per_s"], color="C3", linestyle="--", label="matmul ceiling")
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=7)
        ax.set_title(f"{r['model']} {r['dtype']} batch {r['batch']}", fontsize=9)
        ax.set_ylabel("images/s")
        ax.legend(fontsize=7)
    save_figure(fig, path)
    plt.close(fig)


def main(quick: bool = False, out: Path = OUT, device: str = "cpu", kinds: tuple[str, ...] = ("inference", "training")) -> Path:
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
        for i, case in enumerate(plan["training"] if "training" in kinds else []):
            batch = 2 if quick else (16 if case.vitzoo_name == "vit_s16" else 4) * (8 if device.type == "cuda" else 1)
            save(training(i, case, batch, reps, quick, not quick, device))
    rows = [r for r in store.runs if r.get("quick", False) == quick and r["device"] == str(device)]
    write_text(out / "README.md", "# Speed\n\n" + report(rows, out) + "\n")
    return out


if __name__ == "__main__":
    argv = sys.argv[1:]
    device_arg = argv[argv.index("--device") + 1] if "--device" in argv else "cpu"
    if argv[:1] == ["--probe"]:
        probe(int(argv[1]), argv[2], int(argv[3]), argv[4], "--quick" in argv, torch.device(device_arg))
    else:
        only = argv[argv.index("--only") + 1].split(",") if "--only" in argv else ["inference", "training"]
        main(quick="--quick" in argv, device=device_arg, kinds=tuple(only))
