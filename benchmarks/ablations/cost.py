"""Computational cost (paper Figure 12, Appendix D.5): inference speed and the largest batch that
fits, against input size, for the named models on the current device.

On CUDA the largest batch is found by trying (doubling, then bisecting on out-of-memory). On a CPU
nothing runs out of memory gracefully, so each point runs in a child process that reports its peak
resident memory for two batch sizes; the largest batch is extrapolated from the per-image slope
within a memory budget (stated in the table). The children fork from a server that imported torch
and vitzoo once (an interpreter and its imports per child: 3 CPU seconds each, 28 in the rehearsal).
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from pathlib import Path

import torch

import vitzoo
from benchmarks.figures import plt
from benchmarks.spec import Ablation, Cell, Scale
from benchmarks.suite import Run, markdown_image, markdown_table, peak_memory_growth_gb, save_figure
from vitzoo.train.distributed import pick_device

MODELS = {
    "cpu": ["vit_b32", "vit_b16", "vit_l32", "vit_b16_hybrid", "vit_l16"],
    "paper": ["vit_b32", "vit_l32", "vit_b16", "vit_l16", "vit_h14", "vit_b16_hybrid", "vit_l32_hybrid"],
}
# the rehearsal's two sizes are every model's at 224 and 448, shrunk with the model (32 and 64 px)
SIZES = {"cpu": [64, 128, 224, 384], "paper": [64, 128, 224, 384, 512], "rehearsal": [224, 448]}
CPU_MEMORY_BUDGET_GB = 16.0


def sizes_for(name: str, sizes: list[int]) -> list[int]:
    stride = vitzoo.create(name, device="meta").stride[0]
    return [s for s in sizes if s % stride == 0 and s >= 2 * stride]


def cells(scale: Scale) -> list[Cell]:
    """Each named model at each input size its stride divides; inference at batch 8 in float32."""
    kind = "paper" if scale.cells == "paper" else "cpu"
    models, sizes = (["vit_s32"], [64]) if scale.name == "quick" else (MODELS[kind], SIZES.get(scale.name, SIZES[kind]))
    batch = 2 if scale.name == "quick" else 8
    return [Cell(name, {"model": name, "img_size": size}, {"img_size": size}, {"batch": batch, "dtype": "float32"},
                 model=name, inherit=False)
            for name in models for size in sizes_for(name, sizes)]


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work (CUDA runs asynchronously), on that device, not the current one."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(model: torch.nn.Module, x: torch.Tensor, reps: int) -> list[float]:
    with torch.inference_mode():
        model(x)  # warm-up
        rates = []
        for _ in range(reps):
            synchronize(x.device)
            start = time.perf_counter()
            model(x)
            synchronize(x.device)
            rates.append(x.shape[0] / (time.perf_counter() - start))
    return rates


BATCH_CAP = 4096  # the largest batch tried on a GPU: a model that fits it is reported as "at least" this


def largest_cuda_batch(model: torch.nn.Module, size: int, limit: int = BATCH_CAP) -> int:
    """The largest inference batch that fits on the model's GPU, up to `limit`."""
    device = next(model.parameters()).device

    def fits(batch: int) -> bool:
        try:
            with torch.inference_mode():
                model(torch.randn(batch, 3, size, size, device=device))
            synchronize(device)
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()

    good, bad = 0, None
    batch = 1
    while batch <= limit and fits(batch):
        good, batch = batch, batch * 2
    bad = min(batch, limit + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def probe(name: str, options: dict, batch: int) -> dict:
    """In a fresh process: resident memory of the model, and the peak a forward at `batch` adds."""
    model = vitzoo.create(name, **options).eval()
    x = torch.randn(batch, 3, *model.config.img_size)

    def forward():
        with torch.inference_mode():
            model(x)

    return {"weights_gb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
            "peak_gb": peak_memory_growth_gb(forward)}


# Peak resident memory moves by up to ~20 MB between runs of the same forward (pages, the allocator's
# caches): a growth between the two batches below this is not told from noise
MEMORY_RESOLUTION_GB = 32 / 1024


def _probe_into(connection, name: str, options: dict, batch: int) -> None:  # the child of `probed`
    connection.send(probe(name, options, batch))
    connection.close()


def probed(name: str, options: dict, batch: int) -> dict:
    """`probe` in a process of its own, forked from a fork server (the one the launcher uses, or one
    started here with the same imports): a fresh process for the memory it measures, without a fresh
    interpreter importing torch."""
    from benchmarks.runner import PRELOAD

    if "forkserver" in multiprocessing.get_all_start_methods():
        multiprocessing.set_forkserver_preload([*PRELOAD, __name__])  # read only if no server runs yet
        context = multiprocessing.get_context("forkserver")
    else:
        context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_probe_into, args=(send, name, options, batch))
    child.start()
    send.close()
    try:
        return receive.recv()
    except EOFError:
        child.join()
        raise RuntimeError(f"the memory probe of {name} at batch {batch} ended without a result (exit code "
                           f"{child.exitcode}; its error is above)") from None
    finally:
        child.join()


def cpu_largest_batch(name: str, options: dict, batch: int) -> dict:
    return extrapolated(*[(b, probed(name, options, b)) for b in (max(1, batch // 4), batch)])


def extrapolated(small: tuple[int, dict], large: tuple[int, dict], budget_gb: float = CPU_MEMORY_BUDGET_GB) -> dict:
    """The largest batch within `budget_gb`, from the peak memory of a forward at two batch sizes. A growth
    under the resolution gives a lower bound ("resolved": False): a per-image cost at most the resolution's."""
    (b1, p1), (b2, p2) = small, large
    growth = p2["peak_gb"] - p1["peak_gb"]
    resolved = growth >= MEMORY_RESOLUTION_GB
    per_image = max(growth, MEMORY_RESOLUTION_GB) / max(b2 - b1, 1)
    fixed = p2["weights_gb"] + max(p2["peak_gb"] - per_image * b2, 0.0)
    return {"largest_batch": int((budget_gb - fixed) // per_image), "resolved": resolved, "growth_gb": growth,
            "per_image_gb": per_image, "fixed_gb": fixed, "memory_budget_gb": budget_gb}


def measure(run: Run, device: str, out: Path | None = None) -> dict:
    """Inference speed and the largest batch of the run's model (`out`: nothing is trained or written)."""
    name, options, batch = run.config["model"], run.config["options"], run.config["train"]["batch"]
    where = pick_device(device)  # `auto` becomes a real device; cuda:1 stays cuda:1
    model = vitzoo.create(name, **options).eval().to(where)  # the named model at a size (shrunk at the rehearsal)
    size = model.config.img_size[0]
    rates = images_per_second(model, torch.randn(batch, 3, size, size, device=where), reps=3)
    median = sorted(rates)[len(rates) // 2]
    memory = (
        {"largest_batch": largest_cuda_batch(model, size), "batch_cap": BATCH_CAP} if where.type == "cuda"
        else cpu_largest_batch(name, options, batch)
    )
    info = vitzoo.count_params(model)
    return {"metrics": {"images_per_s": median, "images_per_s_all": rates, "measured_on": str(where), **memory},
            "params": info}


def largest_batch(metrics: dict) -> str | int:
    """The largest batch as measured: one that reached the cap that was tried is "at least" the cap, and
    one whose memory growth the CPU's probe did not resolve is "at least" its lower bound."""
    cap = metrics.get("batch_cap")
    if cap is not None and metrics["largest_batch"] >= cap:
        return f"at least {cap}"
    return f"at least {metrics['largest_batch']}" if metrics.get("resolved") is False else metrics["largest_batch"]


def report(records: list[dict], out: Path) -> str:
    pyplot = plt()
    models = list(dict.fromkeys(r["config"]["model"] for r in records))
    fig, (left, right) = pyplot.subplots(1, 2, figsize=(10, 4))
    rows = []
    for name in models:
        mine = sorted((r for r in records if r["config"]["model"] == name), key=lambda r: r["group"]["img_size"])
        sizes = [r["group"]["img_size"] for r in mine]
        left.plot(sizes, [r["metrics"]["images_per_s"] for r in mine], "o-", label=name)
        right.plot(sizes, [r["metrics"]["largest_batch"] for r in mine], "o-", label=name)
        rows += [[name, r["group"]["img_size"], r["metrics"]["images_per_s"], largest_batch(r["metrics"])] for r in mine]
    for ax, title in ((left, "inference speed (images/s)"), (right, "largest batch")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("input size (px)")
        ax.set_title(title)
    left.legend(fontsize=7)
    save_figure(fig, out / "cost.png")
    pyplot.close(fig)
    device = records[0]["metrics"].get("measured_on", records[0]["device"]) if records else "?"
    budget = (f" On the GPU the largest batch is found by trying batches up to {BATCH_CAP}: \"at least {BATCH_CAP}\" is "
              "a model that fitted every batch tried." if device.startswith("cuda") else (
        f" On the CPU the largest batch is extrapolated from the measured peak resident memory at two batch "
        f"sizes, within a {CPU_MEMORY_BUDGET_GB:.0f} GB budget; where the peak grew by less than "
        f"{MEMORY_RESOLUTION_GB * 1024:.0f} MB between them (run-to-run noise) it is a lower bound, \"at least\"."))
    return (
        f"Inference at batch {records[0]['config']['train']['batch'] if records else '?'}, float32, on `{device}`."
        + budget + "\n\n" + markdown_table(["model", "input px", "images/s", "largest batch"], rows)
        + "\n\n" + markdown_image("cost.png")
    )


SPEC = Ablation(
    name="cost",
    title="Computational cost (Appendix D.5, Figure 12)",
    cells=cells,
    seeds=lambda scale: 1,  # a timing, not a training: its spread is in images_per_s_all
    measure=measure,
    report=report,
    parallel=False,  # a speed measurement must have the machine to itself
    trains=False,
)


if __name__ == "__main__":  # one probe by hand: python -m benchmarks.ablations.cost MODEL OPTIONS_JSON BATCH
    print(json.dumps(probe(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))))
