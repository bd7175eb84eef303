"""Computational cost (Appendix D.5, Figure 12): inference speed and the largest batch that fits,
against input size, for the named models on this device. Speed is timed as benchmarks/speed.py
times it. On CUDA the largest batch is found by trying; on a CPU it is extrapolated from the peak
resident memory of two batch sizes, each measured in a fresh process, within a memory budget."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import torch

import vitzoo
from benchmarks.figures import plt, save
from benchmarks.spec import Ablation, Cell
from benchmarks.suite import markdown_image, markdown_table, peak_memory_growth_gb
from vitzoo.train.distributed import pick_device

MODELS = {"cpu": ["vit_b32", "vit_b16", "vit_l32", "vit_b16_hybrid", "vit_l16"],
          "paper": ["vit_b32", "vit_l32", "vit_b16", "vit_l16", "vit_h14", "vit_b16_hybrid",
                    "vit_l32_hybrid"]}
# the rehearsal's sizes are 224 and 448 px, shrunk with the model
SIZES = {"cpu": [64, 128, 224, 384], "paper": [64, 128, 224, 384, 512], "rehearsal": [224, 448]}
CPU_MEMORY_BUDGET_GB = 16.0
BATCH_CAP = 4096  # the largest batch tried on a GPU: one that fits is "at least" this
# peak resident memory moves by up to ~20 MB between runs of one forward: a smaller growth is noise
MEMORY_RESOLUTION_GB = 32 / 1024


def cells(scale) -> list[Cell]:
    """Each named model at each input size its stride divides; inference in float32."""
    kind = "paper" if scale.cells == "paper" else "cpu"
    quick = scale.name == "quick"
    models = ["vit_s32"] if quick else MODELS[kind]
    sizes = [64] if quick else SIZES.get(scale.name, SIZES[kind])
    train = {"batch": 2 if quick else 8, "dtype": "float32"}
    out = []
    for name in models:
        stride = vitzoo.create(name, device="meta").stride[0]
        out += [Cell(name, {"model": name, "img_size": size}, {"img_size": size}, train, model=name,
                     inherit=False) for size in sizes if size % stride == 0 and size >= 2 * stride]
    return out


def largest_cuda_batch(model: torch.nn.Module, size: int) -> int:
    """The largest inference batch that fits on the model's GPU, up to the cap: doubling, then
    bisection."""
    from benchmarks.speed import runner, synchronize  # torch._dynamo's import takes seconds

    device = next(model.parameters()).device

    def fits(batch: int) -> bool:
        try:
            runner(model, torch.randn(batch, 3, size, size, device=device), None)()
            synchronize(device)
            return True
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            return False

    good, batch = 0, 1
    while batch <= BATCH_CAP and fits(batch):
        good, batch = batch, batch * 2
    bad = min(batch, BATCH_CAP + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def probe(name: str, options: dict, batch: int) -> dict:
    """The model's weights, and the peak resident memory a forward at `batch` adds."""
    from benchmarks.speed import runner

    model = vitzoo.create(name, **options).eval()
    x = torch.randn(batch, 3, *model.config.img_size)
    return {"weights_gb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30,
            "peak_gb": peak_memory_growth_gb(runner(model, x, None))}


def cpu_largest_batch(name: str, options: dict, batch: int) -> dict:
    points = []
    for b in (max(1, batch // 4), batch):  # each in a fresh process: its peak is its own
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            points.append((b, pool.submit(probe, name, options, b).result()))
    return extrapolated(*points)


def extrapolated(small: tuple[int, dict], large: tuple[int, dict],
                 budget_gb: float = CPU_MEMORY_BUDGET_GB) -> dict:
    """The largest batch within `budget_gb` from the peak memory at two batch sizes; a growth
    under the resolution gives a lower bound ("resolved": False)."""
    (b1, p1), (b2, p2) = small, large
    growth = p2["peak_gb"] - p1["peak_gb"]
    per_image = max(growth, MEMORY_RESOLUTION_GB) / max(b2 - b1, 1)
    fixed = p2["weights_gb"] + max(p2["peak_gb"] - per_image * b2, 0.0)
    return {"largest_batch": int((budget_gb - fixed) // per_image),
            "resolved": growth >= MEMORY_RESOLUTION_GB, "growth_gb": growth,
            "per_image_gb": per_image, "fixed_gb": fixed, "memory_budget_gb": budget_gb}


def measure(run, device: str, out=None) -> dict:
    """Inference speed and the largest batch of the run's model; nothing is trained."""
    from benchmarks.speed import interleaved, runner

    name, options, batch = run.config["model"], run.config["options"], run.config["train"]["batch"]
    where = pick_device(device)
    model = vitzoo.create(name, **options).eval().to(where)
    size = model.config.img_size[0]
    x = torch.randn(batch, 3, size, size, device=where)
    timing = interleaved({"forward": runner(model, x, None)}, 3, batch, where)["forward"]
    memory = ({"largest_batch": largest_cuda_batch(model, size), "batch_cap": BATCH_CAP}
              if where.type == "cuda" else cpu_largest_batch(name, options, batch))
    return {"metrics": {"images_per_s": timing["images_per_s"], "timing": timing,
                        "measured_on": str(where), **memory}, "params": vitzoo.count_params(model)}


def largest_batch(metrics: dict) -> str | int:
    """As measured: "at least" the cap where it fitted, or the CPU's unresolved lower bound."""
    cap = metrics.get("batch_cap")
    if cap is not None and metrics["largest_batch"] >= cap:
        return f"at least {cap}"
    unresolved = metrics.get("resolved") is False
    return f"at least {metrics['largest_batch']}" if unresolved else metrics["largest_batch"]


def report(records: list[dict], out) -> str:
    fig, axes = plt().subplots(1, 2, figsize=(10, 4))
    rows = []
    for name in dict.fromkeys(r["config"]["model"] for r in records):
        mine = sorted((r for r in records if r["config"]["model"] == name),
                      key=lambda r: r["group"]["img_size"])
        for ax, key in zip(axes, ("images_per_s", "largest_batch")):
            ax.loglog([r["group"]["img_size"] for r in mine], [r["metrics"][key] for r in mine],
                      "o-", label=name)
        rows += [[name, r["group"]["img_size"], r["metrics"]["images_per_s"],
                  largest_batch(r["metrics"])] for r in mine]
    for ax, title in zip(axes, ("inference speed (images/s)", "largest batch")):
        ax.set(xlabel="input size (px)", title=title)
    axes[0].legend(fontsize=7)
    save(fig, out / "cost.png")
    device = records[0]["metrics"]["measured_on"]
    if device.startswith("cuda"):
        how = (f" On the GPU the largest batch is found by trying batches up to {BATCH_CAP}: \"at "
               f"least {BATCH_CAP}\" is a model that fitted every batch tried.")
    else:
        how = (" On the CPU the largest batch is extrapolated from the measured peak resident "
               f"memory at two batch sizes, within a {CPU_MEMORY_BUDGET_GB:.0f} GB budget; where "
               f"the peak grew by less than {MEMORY_RESOLUTION_GB * 1024:.0f} MB between them "
               "(run-to-run noise) it is a lower bound, \"at least\".")
    return (f"Inference at batch {records[0]['config']['train']['batch']}, float32, on "
            f"`{device}`.{how}\n\n"
            + markdown_table(["model", "input px", "images/s", "largest batch"], rows)
            + "\n\n" + markdown_image("cost.png"))


SPEC = Ablation(
    name="cost",
    title="Computational cost (Appendix D.5, Figure 12)",
    cells=cells,
    seeds=1,  # a timing, not a training: its spread is in the timing's min and max
    measure=measure,
    report=report,
    parallel=False,  # a timing must have the machine to itself
    trains=False,
)
