"""The speed benchmark's README: every contestant's images/s and spread, its share of the
matrix-product ceiling and its page faults; the fast paths over the faster eager peer; the training
step's memory; the machine's ceilings; the converted weights' logit parity; the figure."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.figures import plt
from benchmarks.speed.cases import STORED_PROBABILITIES
from benchmarks.suite import markdown_image, markdown_table, save_figure

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


def at_their_fastest(rows: list[dict]) -> str:
    """The fastest-configuration comparison: each peer at its best of float32 and half precision
    (eager), against `vitzoo.inference.for_inference(model)` with no argument and vitzoo's eager float32."""
    table = []
    for r in (r for r in rows if r["kind"] == "fastest"):
        rate = {k: v["images_per_s"] for k, v in r["speeds"].items()}
        faster = max(r["peer_best"].values(), key=rate.get)
        table.append([r["model"], r["batch"], r["choice"], round(rate["vitzoo.fast()"], 2), faster, round(rate[faster], 2),
                      f"{rate['vitzoo.fast()'] / rate[faster]:.2f}x",
                      f"{rate['vitzoo.fast()'] / rate['vitzoo float32']:.2f}x"])
    if not table:
        return ""
    return ("### Each at its fastest: `vitzoo.inference.for_inference(model)` with no argument\n\n"
            "Every peer eager in float32 and in half precision under autocast, its faster one counted; vitzoo's "
            "fast path in the precision it picks on this machine (`vitzoo.fastest`), compiled where that measured "
            "faster (`compile=\"auto\"`, the default; the column *picked* says which); interleaved in one run.\n\n"
            + markdown_table(["model", "batch", "picked", "vitzoo.fast() images/s", "fastest peer", "its images/s",
                              "over it", "over vitzoo float32"], table))


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
        *([at_their_fastest(rows)] if at_their_fastest(rows) else []),
        markdown_image("speed.png"),
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

