"""The guard of NUMERICS_VERSION (`benchmarks.suite`): two tiny runs trained as the ablations
train theirs (the small scales' ViT and a hybrid, 8 steps on 256 Fashion-MNIST images in one CPU
thread), whose numbers tests/numerics_trace.json records with their version: the loss at every
step, the test loss, test accuracy and 5-shot accuracy. A change that moves them fails
tests/test_numerics.py until the version is bumped and the trace re-recorded (RECORD, which
refuses to overwrite a trace of the current version with other numbers).
"""

from __future__ import annotations

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
TOLERANCE = 1e-4  # another CPU's vector width may round float32 sums differently

TRAIN = dict(SMALL_RECIPE, lr=2e-3, epochs=None, steps=8, batch_size=32, train_limit=256,
             test_limit=128, log_every=1)
HYBRID = {"stem": "resnet", "stem_options": {"layers": ()}, "patch_size": 1, "embed_dim": 32,
          "num_heads": 2, "mlp_dim": 64, "pool": "gap"}
RUNS = {
    "vit": Run("numerics", "vit", {"model": "vit_ti16", "options": dict(MAIN_MODEL, depth=2),
                                   "train": TRAIN}),
    "hybrid": Run("numerics", "hybrid", {"model": "vit_ti16",
                                         "options": dict(MAIN_MODEL, depth=1, **HYBRID),
                                         "train": TRAIN}),
}


def numbers_of(run: Run, folder: Path) -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same summation order on every machine
    try:
        outcome = measure(run, device="cpu", out=folder)
    finally:
        torch.set_num_threads(threads)
    lines = [json.loads(line) for line in (folder / "train/metrics.jsonl").read_text().splitlines()]
    summary = json.loads((folder / "train" / "summary.json").read_text())
    return {"losses": [line["loss"] for line in lines if "loss" in line and "grad_norm" in line],
            "test_loss": summary["test_loss"], "test_acc": outcome["metrics"]["test_acc"],
            "fewshot_5": outcome["metrics"]["fewshot_5"]}


def trace() -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="vitzoo-numerics-") as tmp:
        return {name: numbers_of(run, Path(tmp) / name) for name, run in RUNS.items()}


def differences(recorded: dict, measured: dict) -> list[str]:
    """What differs between two traces beyond TOLERANCE, one line each."""
    out = []
    for name in sorted(set(recorded) | set(measured)):
        old, new = recorded.get(name, {}), measured.get(name, {})
        for key in sorted(set(old) | set(new)):
            a, b = old.get(key), new.get(key)
            xs, ys = (a if isinstance(a, list) else [a]), (b if isinstance(b, list) else [b])
            if len(xs) != len(ys) or not all(
                    x is not None and y is not None
                    and math.isclose(x, y, rel_tol=TOLERANCE, abs_tol=TOLERANCE * 1e-2)
                    for x, y in zip(xs, ys)):
                out.append(f"{name} {key}: recorded {a}, measured {b}")
    return out


def read_trace(path: Path = TRACE) -> dict[str, Any]:
    if not path.exists():
        raise FileNotFoundError(f"no numerics trace at {path}: record it with {RECORD}")
    return json.loads(path.read_text())


def record(path: Path = TRACE, measured: dict | None = None) -> str:
    """Write the trace of NUMERICS_VERSION, unless one of this version holds other numbers."""
    measured = trace() if measured is None else measured
    if path.exists():
        old = read_trace(path)
        changed = differences(old["runs"], measured)
        if old["numerics"] == NUMERICS_VERSION and changed:
            raise SystemExit(f"training's numbers changed ({changed[0]}): bump NUMERICS_VERSION "
                             f"in benchmarks/suite.py first, then {RECORD}")
    write_text(path, json.dumps({"numerics": NUMERICS_VERSION, "torch": torch.__version__,
                                 "runs": measured}, indent=1, sort_keys=True) + "\n")
    return f"recorded the trace of numerics version {NUMERICS_VERSION} in {path}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit(f"usage: {RECORD}  (tests/test_numerics.py compares the numbers)")
    print(record())
