"""Speed: vitzoo against timm and torchvision on the same architecture, weights and inputs.

    python -m benchmarks.speed [--only inference|training|fastest] [--quick] [--device cpu|cuda]
    python -m benchmarks.speed --report-only       (README.md and under_load.md from the records)
    python -m benchmarks.speed profile MODEL [--peer timm] [--dtype bf16] ...

A runner per kind of case, as in timm's benchmark.py: inference, a training step, each contestant
at its fastest precision, the operator profile (timed by speed_timing.py). Records are stored as
measured, with their machine; the README is written from them all.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
import torch._dynamo

import vitzoo
from benchmarks.figures import plt
from benchmarks.machine import environment
from benchmarks.speed_timing import (DTYPES, STORED_PROBABILITIES, Case, cases, check_parity,
                                     compiled_training_step, converted, interleaved, matmul_ceiling,
                                     operator_ms, peak_memory_gb, precisions, probe,
                                     product_shapes, runner, sdpa_backends, table, train_step_fn,
                                     under_load_report, usable)
from benchmarks.suite import RESULTS, ResultStore, markdown_image, markdown_table, save_figure
from vitzoo.argvalues import ArgumentParser
from vitzoo.inference import compile_for_inference, compile_for_training, for_inference
from vitzoo.io import write_text

OUT = RESULTS / "speed"
KINDS = ("inference", "training", "fastest")
# the rows of the table against the faster eager peer
FAST_PATHS = ("vitzoo", "vitzoo+compile", STORED_PROBABILITIES, "vitzoo.fast",
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


# ---------------------------------------------------------------- the runners
def inference(case: Case, batches: list[int], reps: int, compile_at: int | None,
              device: torch.device) -> list[dict]:
    torch.manual_seed(0)
    peers = {lib: build().eval() for lib, build in case.peers.items()}
    # vitzoo holds the first peer's weights; each peer's are checked through a converted copy
    model = converted(next(iter(peers.values())), case).eval()
    x1 = torch.randn(1, 3, case.img_size, case.img_size)
    parity = {lib: check_parity(peer, converted(peer, case), x1) for lib, peer in peers.items()}
    gflops = vitzoo.count_flops(model.config) / 1e9  # one image's forward pass
    for m in (model, *peers.values()):
        m.to(device)
    rows = []
    for dtype_name, dtype in precisions(device).items():
        # weights cast once, no autocast (for_inference converts in place: a copy of its own)
        fast = None if dtype is None else for_inference(copy.deepcopy(model), dtype)
        for batch in batches:
            ceiling = matmul_ceiling(product_shapes(model, batch), dtype, reps, device)
            x = torch.randn(batch, 3, case.img_size, case.img_size, device=device)
            contestants = {"vitzoo": runner(model, x, dtype),
                           **{lib: runner(peer, x, dtype) for lib, peer in peers.items()}}
            if fast is not None:
                contestants["vitzoo.fast"] = runner(fast, x, None)
            if batch == compile_at:
                # Dynamo keeps a few graphs per function across every model: forget earlier cases'
                torch._dynamo.reset()
                contestants["vitzoo+compile"] = runner(
                    compile_for_inference(model, x, autocast=dtype), x, dtype)
                if dtype is not None:
                    compiled = for_inference(copy.deepcopy(model), dtype, compile=True)
                    contestants["vitzoo.fast+compile"] = runner(compiled, x, None)
                for lib, peer in peers.items():
                    contestants[f"{lib}+compile"] = runner(
                        compile_for_inference(peer, x, autocast=dtype), x, dtype)
                for name, kernel in sdpa_backends(device).items():
                    contestants[f"vitzoo[{name}]"] = runner(model, x, dtype, kernel)
            speeds = interleaved(usable(contestants), reps, batch, device)
            rows.append({"kind": "inference", "model": case.vitzoo_name, "dtype": dtype_name,
                         "batch": batch, "img_size": case.img_size, "gflops_per_image": gflops,
                         "matmul_gflops_per_s": ceiling, "ceiling_images_per_s": ceiling / gflops,
                         "speeds": speeds, "max_abs_logit_diff": parity})
            said(rows[-1])
    return rows


def at_their_fastest(case: Case, batch: int, reps: int, device: torch.device) -> list[dict]:
    """Every peer eager in float32 and in half precision under autocast, vitzoo eager in float32,
    and `for_inference(model)` with no argument (the device's rule), interleaved in one run."""
    torch.manual_seed(0)
    peers = {lib: build().eval() for lib, build in case.peers.items()}
    model = converted(next(iter(peers.values())), case).eval().to(device)
    peers = {lib: peer.to(device) for lib, peer in peers.items()}
    fast = for_inference(copy.deepcopy(model))
    x = torch.randn(batch, 3, case.img_size, case.img_size, device=device)
    contestants = {"vitzoo float32": runner(model, x, None), "vitzoo.fast()": runner(fast, x, None)}
    for dtype_name, dtype in precisions(device).items():
        contestants.update({f"{lib} {dtype_name}": runner(peer, x, dtype)
                            for lib, peer in peers.items()})
    speeds = interleaved(contestants, reps, batch, device)
    best = {lib: max((n for n in speeds if n.startswith(lib + " ")),
                     key=lambda n: speeds[n]["images_per_s"]) for lib in peers}
    row = {"kind": "fastest", "model": case.vitzoo_name, "dtype": "each its fastest",
           "batch": batch, "img_size": case.img_size, "speeds": speeds, "peer_best": best,
           "choice": fast.describe(), "choice_dtype": str(fast.dtype).replace("torch.", ""),
           "call": "vitzoo.inference.for_inference(model)"}
    said(row)
    return [row]


def training(case_index: int, case: Case, batch: int, reps: int, quick: bool,
             device: torch.device) -> list[dict]:
    torch.manual_seed(0)
    peers = {lib: build().to(device) for lib, build in case.peers.items()}
    model = converted(next(iter(peers.values())), case).to(device)
    gflops = vitzoo.count_flops(model.config, backward=True) / 1e9  # forward and backward
    rows = []
    for dtype_name, dtype in precisions(device).items():
        ceiling = matmul_ceiling(product_shapes(model, batch), dtype, reps, device)
        contestants = {"vitzoo": model, **peers}
        if not quick:  # the peers are compiled for inference only: their compiled step is slow here
            torch._dynamo.reset()
            contestants["vitzoo+compile"] = compile_for_training(model)
            if dtype is not None and device.type == "cpu":  # where storing changes the kernel
                stored = copy.deepcopy(model)
                stored.set_attention_probabilities_stored(True)
                contestants[STORED_PROBABILITIES] = compile_for_training(stored)
        steps = {name: train_step_fn(m, batch, case.img_size, dtype, device,
                                     fused=compiled_training_step(name))
                 for name, m in contestants.items()}
        speeds = interleaved(steps, reps, batch, device)
        probes = {name: peak_memory_gb(case_index, name, batch, dtype_name, quick, device)
                  for name in contestants}
        rows.append({"kind": "training", "model": case.vitzoo_name, "dtype": dtype_name,
                     "batch": batch, "img_size": case.img_size, "gflops_per_image": gflops,
                     "matmul_gflops_per_s": ceiling, "ceiling_images_per_s": ceiling / gflops,
                     "speeds": speeds,
                     "peak_memory_gb": {n: p["peak_gb"] for n, p in probes.items()},
                     "peak_resident_gb": {n: p["resident_gb"] for n, p in probes.items()},
                     "compiler_memory_gb": {n: p["compiler_gb"] for n, p in probes.items()
                                            if compiled_training_step(n)}})
        said(rows[-1])
    return rows


def said(row: dict) -> None:
    print(f"  {row['kind']} {row['model']} {row['dtype']} batch {row['batch']}: "
          + ", ".join(f"{k} {v['images_per_s']:.2f}" for k, v in row["speeds"].items()), flush=True)


# ---------------------------------------------------------------- the README
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
    fastest = [r for r in rows if r["kind"] == "fastest"]
    table = []
    for r in fastest:
        rate = {k: v["images_per_s"] for k, v in r["speeds"].items()}
        faster = max(r["peer_best"].values(), key=rate.get)
        fast = rate["vitzoo.fast()"]
        table.append([r["model"], r["batch"], r["choice"], round(fast, 2), faster,
                      round(rate[faster], 2),
                      f"{fast / rate[faster]:.2f}x", f"{fast / rate['vitzoo float32']:.2f}x"])
    if not table:
        return []
    calls = ", ".join(sorted({f"`{r['call']}`" for r in fastest}))  # the call each record measured
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

    table = [timed(r, name, s) for r in inference for name, s in r["speeds"].items()]

    def gb(r: dict, field: str, name: str) -> str:  # blank where a contestant has none
        return "" if name not in r.get(field, {}) else f"{r[field][name]:.2f}"

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


def profile(args: argparse.Namespace, parser: ArgumentParser) -> Path:
    """Where vitzoo and a peer spend an eager inference call, operator by operator."""
    by_name = {case.vitzoo_name: case for case in cases(quick=False)["inference"]}
    if args.model not in by_name:
        parser.error(f"no speed-benchmark case {args.model!r}: use one of {', '.join(by_name)}")
    case = by_name[args.model]
    if args.peer not in case.peers:
        parser.error(f"{args.model} has no {args.peer} peer: use one of {', '.join(case.peers)}")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    peer = case.peers[args.peer]().eval()
    model = converted(peer, case).eval()
    x, dtype = torch.randn(args.batch, 3, case.img_size, case.img_size), DTYPES[args.dtype]
    mine, theirs = operator_ms(model, x, dtype, args.calls), operator_ms(peer, x, dtype, args.calls)
    env = environment("cpu")
    flags = ", ".join(env["cpu_flags"]) or "no listed flags"
    text = (f"# Operator profile: {args.model}, vitzoo against {args.peer}, {args.dtype} "
            "(eager)\n\n"
            f"`python -m benchmarks.speed profile {args.model} --peer {args.peer} --dtype "
            f"{args.dtype} --batch {args.batch} --threads {args.threads} --calls {args.calls}`: "
            f"each operator's own CPU time per forward pass of batch {args.batch} at "
            f"{case.img_size} px, {args.threads} thread(s), mean of {args.calls} profiled calls "
            "after two warm-up calls. "
            f"{env['cpu']} ({flags}), torch {env['torch']}, commit {env['commit']}, {env['date']}. "
            "Profiler times are for comparing the two columns, not for speed.\n\n"
            + table(mine, theirs, args.peer, args.rows) + "\n")
    path = OUT / f"profile_{args.model}_{args.dtype}.md"
    write_text(path, text)
    print(text)
    return path


# ---------------------------------------------------------------- the command
def case_key(row: dict, quick: bool) -> str:
    key = f"{row['kind']} {row['model']} {row['dtype']} batch {row['batch']}"
    return key + (" quick" if quick else "")


def main(quick: bool = False, out: Path = OUT, device: str = "cpu", kinds: tuple[str, ...] = KINDS,
         report_only: bool = False) -> Path:
    """Measure the cases of `kinds` (the others keep their stored records; none with
    `report_only`), each case stored as soon as it is measured, and write the report."""
    device = torch.device("cuda" if device == "auto" and torch.cuda.is_available()
                          else "cpu" if device == "auto" else device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the speed benchmark runs on cpu or cuda, not {device.type!r}")
    reps, batches, plan = (3, [2], cases(True)) if quick else (7, [1, 8, 32], cases(False))
    store = ResultStore(out)  # one record per case, keyed by what it measures
    kinds = () if report_only else kinds

    def save(rows: list[dict]) -> None:  # after every case: a failure later keeps what was measured
        for row in rows:
            store.add({"key": case_key(row, quick), "quick": quick, **row,
                       **environment(str(device))})

    # past Dynamo's recompile limit a function runs eagerly without a word: an error instead
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for case in plan["inference"] if "inference" in kinds else []:
            save(inference(case, batches, reps, None if quick else 8, device))
        for case in plan["inference"] if "fastest" in kinds else []:
            save(at_their_fastest(case, 2 if quick else 8, reps, device))
        for i, case in enumerate(plan["training"] if "training" in kinds else []):
            batch = 2 if quick else (16 if case.vitzoo_name == "vit_s16" else 4)
            batch *= 8 if device.type == "cuda" else 1
            save(training(i, case, batch, reps, quick, device))
    rows = [r for r in store.runs if r.get("quick", False) == quick and r["device"] == str(device)]
    write_text(out / "README.md", "# Speed\n\n" + report(rows, out) + "\n")
    if report_only and (out / "under_load.json").exists():
        record = json.loads((out / "under_load.json").read_text())
        write_text(out / "under_load.md", under_load_report(record))
    return out


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m benchmarks.speed", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(KINDS), help="kinds of case, comma-separated")
    parser.add_argument("--quick", action="store_true", help="small stand-ins (for the tests)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--out", type=Path, default=OUT, help="where results.json and README.md go")
    parser.add_argument("--report-only", action="store_true", help="report the stored records")
    parser.add_argument("--probe", metavar="CASE,CONTESTANT,BATCH,DTYPE",
                        help="the memory probe's child process")
    commands = parser.add_subparsers(dest="command", metavar="{profile}", help="profile: operators")
    sub = commands.add_parser("profile", help=profile.__doc__)
    sub.add_argument("model", help="a speed-benchmark case: vit_b16 or vit_b16_hybrid")
    sub.add_argument("--peer", default="timm", help="timm or torchvision, where the case has it")
    sub.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="the precision")
    sub.add_argument("--batch", type=int, default=2, help="images per call")
    sub.add_argument("--threads", type=int, default=1, help="torch threads")
    sub.add_argument("--calls", type=int, default=3, help="profiled calls, after a warm-up")
    sub.add_argument("--rows", type=int, default=20, help="rows of the table")
    return parser


def cli(argv: list[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "profile":
        profile(args, parser)
        return
    if args.probe:
        index, contestant, batch, dtype_name = args.probe.split(",")
        print(json.dumps(probe(int(index), contestant, int(batch), dtype_name, args.quick,
                               torch.device(args.device))))
        return
    kinds = tuple(args.only.split(","))
    if set(kinds) - set(KINDS):
        parser.error(f"--only {args.only}: choose among {', '.join(KINDS)}")
    main(args.quick, args.out, args.device, kinds, args.report_only)


if __name__ == "__main__":
    cli(sys.argv[1:])
