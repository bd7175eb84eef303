"""The guard of NUMERICS_VERSION (`benchmarks.suite`): two tiny training runs, trained as the ablations
train theirs, whose numbers are recorded in tests/numerics_trace.json with the version they belong to.
tests/test_numerics.py trains them again and compares: a change that moves training's numbers fails
it until NUMERICS_VERSION is bumped and the trace re-recorded,

    python -m benchmarks.numerics --record

which refuses to overwrite a trace of the current version with other numbers (bump first). Without
`--record` it trains the runs and says whether they match. The runs: the small scales' ViT (patch stem,
learned 1-D position embedding, class token) and a hybrid (the ResNet root, global average pooling),
with the small scales' recipe (AdamW, warm-up, linear decay, clipping, flips), 8 steps on 256
Fashion-MNIST images in one CPU thread: a few seconds each. Their numbers: the training loss at every
step, and the test loss, test accuracy and 5-shot accuracy at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks.scales import MAIN_MODEL, SMALL_RECIPE
from benchmarks.suite import NUMERICS_VERSION, Run
from benchmarks.training import measure
from vitzoo.io import write_text

TRACE = Path(__file__).resolve().parent.parent / "tests" / "numerics_trace.json"
RECORD = "python -m benchmarks.numerics --record"
# Float32 on another CPU (its vector width) may round sums differently: numbers within this relative
# tolerance are the same numbers. A change of the code's numbers moves the losses far more.
TOLERANCE = 1e-4

TRAIN = dict(SMALL_RECIPE, lr=2e-3, epochs=None, steps=8, batch_size=32, train_limit=256, test_limit=128, log_every=1)
HYBRID = {"stem": "resnet", "stem_options": {"layers": ()}, "patch_size": 1, "embed_dim": 32, "num_heads": 2, "mlp_dim": 64,
          "pool": "gap"}
RUNS = {
    "vit": Run("numerics", "vit", {"model": "vit_ti16", "options": dict(MAIN_MODEL, depth=2), "train": TRAIN}),
    "hybrid": Run("numerics", "hybrid", {"model": "vit_ti16", "options": dict(MAIN_MODEL, depth=1, **HYBRID), "train": TRAIN}),
}


def numbers_of(run: Run, folder: Path) -> dict[str, Any]:
    """Train the run in `folder` (one thread: the same summation order on every machine) and read its numbers."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        outcome = measure(run, device="cpu", out=folder)
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(line) for line in (folder / "train" / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "train" / "summary.json").read_text())
    return {"losses": [line["loss"] for line in lines if "loss" in line and "grad_norm" in line],
            "test_loss": summary["test_loss"], "test_acc": outcome["metrics"]["test_acc"],
            "fewshot_5": outcome["metrics"]["fewshot_5"]}


def trace() -> dict[str, dict[str, Any]]:
    """Every run's numbers, trained now."""
    with tempfile.TemporaryDirectory(prefix="vitzoo-numerics-") as tmp:
        return {name: numbers_of(run, Path(tmp) / name) for name, run in RUNS.items()}


def differences(recorded: dict[str, dict[str, Any]], measured: dict[str, dict[str, Any]]) -> list[str]:
    """What differs between two traces beyond TOLERANCE, one line each (none: the same numbers)."""
    out = []
    for name in sorted(set(recorded) | set(measured)):
        if name not in recorded or name not in measured:
            out.append(f"{name}: in {'the measured' if name in measured else 'the recorded'} trace only")
            continue
        for key in sorted(set(recorded[name]) | set(measured[name])):
            a, b = recorded[name].get(key), measured[name].get(key)
            a_list, b_list = (a if isinstance(a, list) else [a]), (b if isinstance(b, list) else [b])
            same = len(a_list) == len(b_list) and all(
                x is not None and y is not None and math.isclose(x, y, rel_tol=TOLERANCE, abs_tol=TOLERANCE * 1e-2)
                for x, y in zip(a_list, b_list))
            if not same:
                out.append(f"{name} {key}: recorded {a}, measured {b}")
    return out


def read_trace(path: Path = TRACE) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"no numerics trace at {path}: record it with {RECORD}")
    return json.loads(path.read_text())


def record(path: Path = TRACE, measured: dict[str, dict[str, Any]] | None = None) -> str:
    """Write the trace of NUMERICS_VERSION; a trace of this version with other numbers is kept, and the
    error says to bump the version first."""
    measured = trace() if measured is None else measured
    if path.exists():
        old = read_trace(path)
        changed = differences(old["runs"], measured)
        if old["numerics"] == NUMERICS_VERSION and changed:
            raise SystemExit(f"training's numbers changed since numerics version {NUMERICS_VERSION} was recorded "
                             f"({changed[0]}): bump NUMERICS_VERSION in benchmarks/suite.py first, then {RECORD}")
    write_text(path, json.dumps({"numerics": NUMERICS_VERSION, "torch": torch.__version__, "runs": measured},
                                indent=1, sort_keys=True) + "\n")
    return f"recorded the trace of numerics version {NUMERICS_VERSION} in {path}"


def build_parser() -> argparse.ArgumentParser:
    from vitzoo.argvalues import ArgumentParser

    parser = ArgumentParser(prog="python -m benchmarks.numerics", description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="train the runs and record their numbers as the trace")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.record:
        print(record())
        return 0
    recorded, measured = read_trace(), trace()
    changed = differences(recorded["runs"], measured)
    if changed:
        print("training's numbers differ from the trace:\n  " + "\n  ".join(changed))
        return 1
    print(f"training's numbers match the trace of numerics version {recorded['numerics']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
