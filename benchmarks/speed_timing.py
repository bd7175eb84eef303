"""How the speed benchmark measures (benchmarks/speed.py runs it): the cases, vitzoo and its peers
on the same weights read through vitzoo's converters; the contestants' calls interleaved in one
process, the order rotated, the device synchronised, page faults counted; the matrix-product
ceiling at the encoder's shapes; a training step's peak memory, in a fresh process per contestant;
each operator's own CPU time; the table of the fast path under load, from its record."""

from __future__ import annotations

import contextlib
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

import vitzoo
from benchmarks.suite import markdown_table, peak_memory_growth_gb, resident_memory_gb
from vitzoo import precision
from vitzoo.inference import compile_for_training
from vitzoo.precision import autocast

# the compiled training step of a model that stores its attention probabilities (bf16 on the CPU)
STORED_PROBABILITIES = "vitzoo+compile+stored_probabilities"
# the records' names of the precisions (float32 by its long name)
DTYPES = {"float32": None, **{k: v for k, v in precision.FIXED.items() if v is not None}}
GPU_PRODUCTS = 100  # products timed together on a GPU, where one takes microseconds


# ---------------------------------------------------------------- the cases
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
        vit = Case("vit_ti16", {
            "timm": timm_model("vit_tiny_patch16_224", depth=2, img_size=64),
            "torchvision": torchvision_model("VisionTransformer", image_size=64, patch_size=16,
                                             num_layers=2, num_heads=3, hidden_dim=192,
                                             mlp_dim=768)},
            64, dict(embed_dim=192, depth=2, num_heads=3))
        return {"inference": [vit], "training": [vit]}
    vit_b16 = Case("vit_b16", {"timm": timm_model("vit_base_patch16_224"),
                               "torchvision": torchvision_model("vit_b_16")})
    # timm's default tag for this hybrid has no classifier: ask for ImageNet's 1000 classes
    hybrid = Case("vit_b16_hybrid", {"timm": timm_model("vit_base_r50_s16_224", num_classes=1000)})
    vit_s16 = Case("vit_s16", {"timm": timm_model("vit_small_patch16_224")})
    return {"inference": [vit_b16, hybrid], "training": [vit_s16, hybrid]}


def precisions(device: torch.device) -> dict[str, torch.dtype | None]:
    """float32, and the device's half precision (`vitzoo.precision.half_of`: bf16, or fp16 on a
    GPU that only emulates bf16)."""
    half = precision.half_of(device)
    return {name: dtype for name, dtype in DTYPES.items() if dtype is None or dtype == half}


def converted(peer: torch.nn.Module, case: Case) -> torch.nn.Module:
    """vitzoo holding the peer's weights, read through vitzoo's own converters."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "peer.pth"
        torch.save(peer.state_dict(), path)
        return vitzoo.create(case.vitzoo_name, pretrained=path, img_size=case.img_size,
                             **(case.options or {}))


def check_parity(peer, model, x) -> float:
    with torch.inference_mode():
        return (peer.eval()(x) - model.eval()(x)).abs().max().item()


def compiled_training_step(contestant: str) -> bool:
    return contestant.startswith("vitzoo+compile")


def train_step_fn(model: torch.nn.Module, batch: int, img_size: int, dtype: torch.dtype | None,
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


# ---------------------------------------------------------------- a fair timing
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":  # CUDA runs asynchronously: a timing must cover the queued work
        torch.cuda.synchronize(device)


def minor_page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def interleaved(fns: dict[str, Callable[[], None]], reps: int, images: int,
                device: torch.device) -> dict[str, dict]:
    """Images/s of each function, one warm-up call each, then repetitions interleaved. The order
    rotates every repetition: the C allocator's heap is shared, and a contestant that always follows
    the same one pays for the pages that one gave back. Minor page faults per call are recorded."""
    for fn in fns.values():
        fn()
    synchronize(device)
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in fns}
    faulted = dict.fromkeys(fns, 0)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            before, start = minor_page_faults(), time.perf_counter()
            fns[name]()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
            faulted[name] += minor_page_faults() - before
    return {name: {"images_per_s": images / statistics.median(t), "min": images / max(t),
                   "max": images / min(t), "reps": len(t),
                   "page_faults_per_call": faulted[name] // len(t)} for name, t in times.items()}


def sdpa_backends(
        device: torch.device) -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    """On CUDA, scaled_dot_product_attention's kernels one at a time (the CPU has one)."""
    if device.type != "cuda":
        return {}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return {name: (lambda b=backend: sdpa_kernel([b])) for name, backend in (
        ("flash", SDPBackend.FLASH_ATTENTION), ("mem_efficient", SDPBackend.EFFICIENT_ATTENTION),
        ("cudnn", SDPBackend.CUDNN_ATTENTION), ("math", SDPBackend.MATH))}


def usable(contestants: dict[str, Callable[[], None]]) -> dict[str, Callable[[], None]]:
    """The contestants that run: an attention kernel this GPU, dtype or shape lacks is left out."""
    kept = {}
    for name, fn in contestants.items():
        try:
            fn()
            kept[name] = fn
        except RuntimeError as exc:
            if "[" not in name:  # only the forced-kernel variants may be missing
                raise
            print(f"  {name}: not available here ({str(exc).splitlines()[0]})", flush=True)
    return kept


def product_shapes(model: torch.nn.Module, batch: int) -> list[tuple[int, int, int]]:
    """(rows, inputs, outputs) of an encoder block's products at `batch`: q/k/v, the projection,
    the MLP's two layers."""
    rows = batch * (model.grid[0] * model.grid[1] + model.num_prefix_tokens)
    d, mlp = model.config.embed_dim, model.config.mlp_dim
    return [(rows, d, 3 * d), (rows, d, d), (rows, d, mlp), (rows, mlp, d)]


def matmul_ceiling(shapes: list[tuple[int, int, int]], dtype: torch.dtype | None, reps: int,
                   device: torch.device) -> float:
    """GFLOP/s of torch.mm over `shapes` in `dtype` (float32 for None): each shape's best time."""
    flops = seconds = 0.0
    for rows, inputs, outputs in shapes:
        a = torch.randn(rows, inputs, device=device, dtype=dtype or torch.float32)
        b = torch.randn(inputs, outputs, device=device, dtype=dtype or torch.float32)
        torch.mm(a, b)
        seconds += min(_seconds_per_product(a, b, device) for _ in range(reps))
        flops += 2 * rows * inputs * outputs
    return flops / seconds / 1e9


def _seconds_per_product(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    if device.type != "cuda":
        start = time.perf_counter()
        torch.mm(a, b)
        return time.perf_counter() - start
    # many products between two CUDA events: the GPU's own clock, no host synchronisation inside
    with torch.cuda.device(device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(GPU_PRODUCTS):
            torch.mm(a, b)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / GPU_PRODUCTS


def runner(model, x: torch.Tensor, mixed: torch.dtype | None, kernel=contextlib.nullcontext):
    def run():
        with torch.inference_mode(), autocast(x.device, mixed), kernel():
            model(x)
    return run


# ---------------------------------------------------------------- a training step's memory
def peak_memory_gb(case_index: int, contestant: str, batch: int, dtype_name: str, quick: bool,
                   device: torch.device) -> dict:
    """{"peak_gb", "resident_gb", "compiler_gb"} of training steps, probed in a fresh process so
    that no contestant inherits another's heap (`python -m benchmarks.speed --probe ...`)."""
    cmd = [sys.executable, "-m", "benchmarks.speed", "--probe",
           f"{case_index},{contestant},{batch},{dtype_name}", "--device", str(device),
           *(["--quick"] if quick else [])]
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    if out.returncode != 0:
        raise RuntimeError(f"the memory probe of {contestant} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe(case_index: int, contestant: str, batch: int, dtype_name: str, quick: bool,
          device: torch.device) -> dict:
    case, dtype = cases(quick)["training"][case_index], DTYPES[dtype_name]
    torch.manual_seed(0)
    lib = contestant.split("+")[0]
    peer = next(iter(case.peers.values()))()
    model = (converted(peer, case) if lib == "vitzoo" else case.peers[lib]()).to(device)
    del peer
    compiled = compiled_training_step(contestant)
    if contestant == STORED_PROBABILITIES:
        model.set_attention_probabilities_stored(True)
    if compiled:
        model = compile_for_training(model)
    # a pass outside the measurement compiles; what the compiler keeps is counted apart
    release_freed_memory(device)
    held = resident_memory_gb()
    model.train()
    with autocast(device, dtype):
        x = torch.randn(batch, 3, case.img_size, case.img_size, device=device)
        model(x).float().sum().backward()
    model.zero_grad(set_to_none=True)
    synchronize(device)
    release_freed_memory(device)
    compiler_gb = resident_memory_gb() - held if compiled else 0.0
    step = train_step_fn(model, batch, case.img_size, dtype, device, fused=compiled)
    # tensor bytes that three steps add (the first allocates the optimizer state): the CUDA
    # allocator's count, or the profiler's allocation events on the CPU; resident memory beside
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
    return {"peak_gb": peak, "resident_gb": resident, "compiler_gb": compiler_gb}


def three_steps(step: Callable[[], None], device: torch.device) -> None:
    for _ in range(3):
        step()
    synchronize(device)


def peak_allocated_bytes(prof) -> int:
    """The most bytes held at once, from the profiler's allocation and release events in order."""
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    held = peak = 0
    for event in events:
        held += event.nbytes()  # negative for a release
        peak = max(peak, held)
    return peak


def release_freed_memory(device: torch.device) -> None:
    """Python's garbage, CUDA's cached blocks and glibc's free heap given back to the system."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the heap stays as it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# ---------------------------------------------------------------- the fast path under load
def under_load_report(record: dict) -> str:
    rows = []
    for p in record["phases"]:
        base, batch = p["timings"]["eager"]["median_s"], record["batch"]
        for name, t in p["timings"].items():
            rows.append(["beside a busy process" if p["loaded"] else "alone",
                         f"{p['load_before']:.1f} / {p['load_after']:.1f}", name,
                         f"{batch / t['median_s']:.2f}",
                         f"{batch / t['max_s']:.2f}-{batch / t['min_s']:.2f}",
                         f"{base / t['median_s']:.2f}x"])
    env, command = record["environment"], record["command"]
    # what a self-tuning contestant settled as, in the phases whose record says it
    settled = "; ".join(f"{'beside a busy process' if p['loaded'] else 'alone'}: {p['auto']}"
                        for p in record["phases"] if "auto" in p)
    return "\n\n".join([
        "# The fast path under load",
        f"`{command.split(' --')[0]}` ({command}), {env['date']}, commit {env['commit']}: "
        f"{record['model']} at batch {record['batch']} in {record['dtype']} ({record['choice']}); "
        f"{env['cpu']} ({', '.join(env['cpu_flags'])}), {env['threads']} threads, "
        f"OMP_WAIT_POLICY={record['omp_wait_policy']}, {record['reps']} interleaved repetitions "
        "per phase. The load average (1 min) before and after each phase counts the other users of "
        "this shared machine too.",
        markdown_table(["phase", "load", "contestant", "images/s", "min-max", "over eager"], rows),
        *([f"`for_inference()` settled as: {settled}"] if settled else []),
    ]) + "\n"


# ---------------------------------------------------------------- the operator profile
def operator_ms(model: torch.nn.Module, x: torch.Tensor, dtype: torch.dtype | None,
                calls: int) -> dict[str, tuple[float, int]]:
    """Each operator's own CPU milliseconds and calls per forward pass, after two warm-up calls."""
    from torch.profiler import ProfilerActivity, profile as recording

    with torch.inference_mode(), autocast(x.device, dtype):
        model(x)
        model(x)
        with recording(activities=[ProfilerActivity.CPU]) as recorded:
            for _ in range(calls):
                model(x)
    return {e.key: (e.self_cpu_time_total / 1e3 / calls, e.count // calls)
            for e in recorded.key_averages()}


def table(mine: dict[str, tuple[float, int]], theirs: dict[str, tuple[float, int]], peer: str,
          rows: int) -> str:
    """The `rows` operators that take the most time in either (ties in name order)."""
    most = lambda k: (-max(mine.get(k, (0, 0))[0], theirs.get(k, (0, 0))[0]), k)  # noqa: E731
    lines = [f"| operator | {peer} ms | calls | vitzoo ms | calls |", "|---|---|---|---|---|"]
    for name in sorted(set(mine) | set(theirs), key=most)[:rows]:
        (t, tn), (v, vn) = theirs.get(name, (0.0, 0)), mine.get(name, (0.0, 0))
        lines.append(f"| `{name}` | {t:.1f} | {tn} | {v:.1f} | {vn} |")
    total_t, total_v = sum(t for t, _ in theirs.values()), sum(v for v, _ in mine.values())
    lines.append(f"| **all operators** | **{total_t:.1f}** | | **{total_v:.1f}** "
                 f"({total_v / total_t:.2f}x) | |")
    return "\n".join(lines)
