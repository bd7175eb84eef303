"""python -m benchmarks LIST [--scale cpu|paper] [--quick] [--workers N] ...

LIST: ablation names (pos_embed, head, hybrid, shape, cost, inspect), `all` (all of them), or `speed`.
`--workers 2` trains two runs at once (one CPU thread each), which suits a 2-core machine.
Results go to benchmarks/results/<ablation>/: results.json, README.md (the table beside the paper's
numbers and which findings reproduced), PNG figures. Runs whose results exist are skipped.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import time
from pathlib import Path

from benchmarks.suite import RESULTS, ResultStore, execute

ABLATIONS = {  # results folder -> module
    "pos_embed": "benchmarks.pos_embed",
    "head": "benchmarks.head",
    "hybrid": "benchmarks.hybrid",
    "shape": "benchmarks.shape",
    "cost": "benchmarks.cost",
    "inspect": "benchmarks.inspection",
}
TITLES = {
    "pos_embed": "Position embeddings (Appendix D.4, Table 8)",
    "head": "Class token vs global average pooling (Appendix D.3, Figure 9)",
    "hybrid": "Hybrid vs ViT vs ResNet at matched compute (Figure 5)",
    "shape": "Transformer shape (Appendix D.2, Figure 8)",
    "cost": "Computational cost (Appendix D.5, Figure 12)",
    "inspect": "Inside trained models (section 4.5, Figures 6, 7, 11)",
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="+", help="ablations to run: " + ", ".join(ABLATIONS) + ", all, or speed")
    parser.add_argument("--scale", choices=("cpu", "paper"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="shrink every run to seconds (for tests)")
    parser.add_argument("--data", default=None, help="dataset for --scale paper: an ImageFolder directory, cifar10, cifar100")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results root (default benchmarks/results)")
    parser.add_argument("--workers", type=int, default=1,
                        help="training runs measured at once, in separate processes sharing the CPU threads "
                             "(2 on a 2-core CPU: small models gain about 1.5x); timing ablations always use one")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    names = list(ABLATIONS) if "all" in args.names else args.names
    unknown = [n for n in names if n not in ABLATIONS and n != "speed"]
    if unknown:
        parser.error(f"unknown ablation {unknown[0]!r}; choose from {', '.join(ABLATIONS)}, all, speed")
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    args.names = names
    return args


def plan_ablation(name: str, args: argparse.Namespace):
    module = importlib.import_module(ABLATIONS[name])
    return module, module.plan(args.scale, args.quick, args.data, args.data_dir)


def run_ablation(name: str, module, runs: list, store: ResultStore, args: argparse.Namespace) -> str:
    out = args.out / name
    measure = getattr(module, "measure", None)
    if measure is None:
        from benchmarks.training import measure
    # an ablation that times things (cost) must not share the machine with itself
    workers = args.workers if getattr(module, "PARALLEL", True) else 1
    records = execute(runs, functools.partial(measure, device=args.device), store, args.device, quiet=args.quiet,
                      workers=workers)
    body = module.report(records, out)
    seen = lambda field: ", ".join(sorted({str(r[field]) for r in records})) or "?"  # noqa: E731
    settings = (f"Settings: `--scale {args.scale}`{' --quick' if args.quick else ''}; {len(records)} runs; "
                f"device {seen('device')}; torch {seen('torch')}; commit {seen('commit')}; every option of every "
                "run is in `results.json`.")
    from vitzoo.io import write_text

    write_text(out / "README.md", f"# {TITLES[name]}\n\n{settings}\n\n{body}\n")
    return body


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    start = time.perf_counter()
    # every ablation planned once, up front: the runs still to measure give the overall ETA
    plans = {name: (*plan_ablation(name, args), ResultStore(args.out / name)) for name in args.names if name in ABLATIONS}
    todo = {name: sum(store.get(run.key) is None for run in runs) for name, (_, runs, store) in plans.items()}
    measured = 0
    for i, name in enumerate(args.names, 1):
        elapsed = time.perf_counter() - start
        left = sum(todo.get(n, 0) for n in args.names[i - 1:])
        eta = f", about {elapsed / measured * left / 60:.0f} min left ({left} runs)" if measured else f", {left} runs to measure"
        if name not in todo:  # speed: not a set of runs
            eta = ""
        print(f"== [{i}/{len(args.names)}] {name}{eta}", flush=True)
        if name == "speed":
            from benchmarks import speed

            speed.main(quick=args.quick, out=args.out / "speed", device=args.device)
            print((args.out / "speed" / "README.md").read_text())
            continue
        print(run_ablation(name, *plans[name], args), flush=True)
        measured += todo[name]
    print(f"== done in {(time.perf_counter() - start) / 60:.1f} min; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
