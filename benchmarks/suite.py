"""What every ablation's runs share: a run keyed by its config, the results store that survives
interruption and is shared by many processes, the record of a measured run, tables and figures.
Where a number was measured is `benchmarks.machine`; how runs are measured, `benchmarks.execute`.

A run's key hashes its config, not the code that trained it; the code is named by NUMERICS_VERSION,
stored in every record: a record of another version is not a result of the current code, so the
store does not count it as measured (a resumed suite measures it again instead of mixing versions in
one table), and only `--report-only` reports it, saying that the versions mix.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks.machine import environment
from vitzoo.io import write_text

RESULTS = Path(__file__).parent / "results"

# The version of training's numbers: bump it with every change that changes what a run of a given config
# and seed measures (initialisation, layers, the loss, the optimizer or its schedule, data order or
# augmentation, evaluation, torch's version), and re-record the trace that guards it
# (`python -m benchmarks.numerics --record`; tests/test_numerics.py fails until both are done).
# Records written before the version existed (every record committed up to issue 24) lack the field and
# count as version 0: they predate the check, and their code is named only by their `commit`.
NUMERICS_VERSION = 1


def numerics_of(record: dict[str, Any]) -> int:
    """The numerics version a record was measured with (0: before versions were recorded)."""
    return int(record.get("numerics", 0))


@dataclass(frozen=True)
class Run:
    """One measurement: a model (vitzoo option names), how it is trained, and a seed."""

    ablation: str
    label: str  # what the row is called in tables and figures
    config: dict[str, Any]  # every model and training option
    seed: int = 0
    group: dict[str, Any] = field(default_factory=dict)  # the ablation's own coordinates (cell, lr, ...)

    @property
    def key(self) -> str:
        """Identifies the result: a hash of the ablation, config and seed (not of the label)."""
        text = json.dumps({"ablation": self.ablation, "config": self.config, "seed": self.seed}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


class ResultStore:
    """`results.json` of one ablation: {"runs": [...]}, shared by every process that measures its runs.

    Each `add` takes the store's lock (an flock on `results.json.lock`), reads what other processes added
    meanwhile, merges the record in and writes the file atomically: two suites on one `--out`, or the
    jobs of a cluster, each keep every result. `runs` is what the file held at the last read or add;
    `order`, if given, sorts the records as they are written (a key function of a record).

    `numerics`: the numerics version whose records count as measured (`get`, `keys`); records of other
    versions stay in the file until a new measurement of the same run replaces them. None counts every
    record whatever its version (reporting what is there: `--report-only`).
    """

    def __init__(self, directory: Path, order: Callable[[dict[str, Any]], Any] | None = None,
                 numerics: int | None = NUMERICS_VERSION) -> None:
        self.directory = Path(directory)
        self.order = order
        self.numerics = numerics
        self.path = self.directory / "results.json"
        self.runs: list[dict[str, Any]] = self._read()

    def _read(self) -> list[dict[str, Any]]:
        return json.loads(self.path.read_text())["runs"] if self.path.exists() else []

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's lock (blocking): the only writer while it is held."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "results.json.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def refresh(self) -> None:
        """Read the results other processes have added since."""
        self.runs = self._read()

    def counts(self, record: dict[str, Any]) -> bool:
        """Whether the record is a result of the code this store measures for (its numerics version)."""
        return self.numerics is None or numerics_of(record) == self.numerics

    def get(self, key: str) -> dict[str, Any] | None:
        """The record of the run with this key, if one of the store's numerics version is there."""
        return next((r for r in self.runs if r["key"] == key and self.counts(r)), None)

    def keys(self) -> set[str]:
        """The keys of the runs measured (of the store's numerics version)."""
        return {r["key"] for r in self.runs if self.counts(r)}

    def add(self, record: dict[str, Any]) -> None:
        with self.locked():
            self.runs = [r for r in self._read() if r["key"] != record["key"]] + [record]
            if self.order is not None:
                self.runs.sort(key=self.order)
            write_text(self.path, json.dumps({"runs": self.runs}, indent=1, sort_keys=True) + "\n")


def make_record(run: Run, outcome: dict[str, Any], wall_s: float, device: str, **launch: Any) -> dict[str, Any]:
    """What the store keeps of a measured run: its key and settings, the numerics version of the code
    that measured it, the outcome, its wall time, how it was launched (launcher, processes, threads of
    each, `started`: the Unix time it began), and its environment."""
    return {"key": run.key, "ablation": run.ablation, "label": run.label, "group": run.group, "config": run.config,
            "seed": run.seed, "numerics": NUMERICS_VERSION, "wall_s": round(wall_s, 2), **outcome,
            **environment(device), **launch}  # the launch's threads (a worker's) over this process's


def run_folder(store: ResultStore, run: Run) -> Path:
    """Where a run trains and keeps its checkpoints, final weights and logs (ignored by git: runs/): one
    folder per numerics version, so that a run of other code, finished or not, is neither read as a
    result of this code nor resumed by it."""
    return store.directory / "runs" / f"{run.key}-n{NUMERICS_VERSION}"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_image(name: str) -> str:
    """A figure shown in a results README (a relative link to the PNG beside it), not only named."""
    return f"![{Path(name).stem.replace('_', ' ')}]({name})"


def save_figure(fig, path: Path) -> None:
    """PNG written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    os.replace(tmp, path)


def _proc_status_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise KeyError(field_name)


def resident_memory_gb() -> float:
    """The process's resident memory now (Linux)."""
    return _proc_status_kb("VmRSS") / 2**20


def peak_memory_growth_gb(fn: Callable[[], object], since_gb: float | None = None) -> float:
    """Peak resident memory while `fn` runs, above `since_gb` (default: what the process holds just
    before it). Linux: the high-water mark is reset through /proc/self/clear_refs first, so earlier
    peaks do not count."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = resident_memory_gb() if since_gb is None else since_gb
    fn()
    return _proc_status_kb("VmHWM") / 2**20 - before
