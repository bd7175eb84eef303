"""The speed benchmark's README (benchmarks/results/speed/) from its records: against the faster
eager peer, inference and training tables with the matrix-product ceiling, the figure; and the
committed records' table of each contestant at its fastest, a runner no longer run."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.figures import plt
from benchmarks.suite import markdown_image, markdown_table, save_figure

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
    save_figure(fig, path)
    pyplot.close(fig)
