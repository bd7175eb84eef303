"""What every ablation's runs share: a run keyed by its config, the results store that survives
interruption and is shared by many processes, the record of a measured run, tables and figures.
Where a number was measured is `benchmarks.machine`; how runs are executed, `benchmarks.runner`.

A run's key hashes its config, not the code that trained it; the code is named by NUMERICS_VERSION,
stored in every record: a record of another version is not a result of the current code, so the
store does not count it as measured (a resumed suite measures it again instead of mixing versions in
one table), and only `--report-only` reports it, saying that the versions mix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from benchmarks.machine import environment
from vitzoo.io import write_text

RESULTS = Path(__file__).parent / "results"

# The version of training's numbers: bump it with every change that changes what a run of a given config
# and seed measures (initialisation, layers, the loss, the optimizer or its schedule, data order or
# augmentation, evaluation, torch's version), and re-record the trace that guards it
# (`python -m benchmarks.numerics --record`; tests/test_numerics.py fails until both are done).
# Records written before the version existed lack the field and
# count as version 0: they predate the check, and their code is named only by their `commit`.
NUMERICS_VERSION = 1
RECORD = "record.json"  # a run's record, in its folder: what results.json is the union of
ARCHIVE = "superseded.json"  # records moved out of results.json, with the reason (benchmarks/archive.py)
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def numerics_of(record: dict[str, Any]) -> int:
    """The numerics version a record was measured with (0: before versions were recorded)."""
    return int(record.get("numerics", 0))


# The threads per process every committed run of a training ablation trained with (two runs at once, one
# thread each, on a 2-core CPU; records written before commit 8abe73c said 2, and were corrected to 1 by
# `benchmarks.archive.correct_threads`). A key holds the thread count only where it differs from this, so
# that every committed key stays the key of its run.
COMMITTED_THREADS = 1


@dataclass(frozen=True)
class Run:
    """One measurement: a model (vitzoo option names), how it is trained, a seed, and the CPU threads of
    each of its processes where they are known before it runs (`threads`; None where they are not, or do
    not enter its numbers: GPUs, SLURM jobs, timings)."""

    ablation: str
    label: str  # what the row is called in tables and figures
    config: dict[str, Any]  # every model and training option
    seed: int = 0
    group: dict[str, Any] = field(default_factory=dict)  # the ablation's own coordinates (cell, lr, ...)
    threads: int | None = None

    @property
    def key(self) -> str:
        """Identifies the result: a hash of the ablation, config and seed (not of the label), and of the
        threads per process where they are stated and differ from COMMITTED_THREADS (the order of a float32
        sum, so a run's last bits, depends on them)."""
        fields = {"ablation": self.ablation, "config": self.config, "seed": self.seed}
        if self.threads is not None and self.threads != COMMITTED_THREADS:
            fields["threads"] = self.threads
        text = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_threads(runs: list[Run], threads: int | None) -> list[Run]:
    """The runs as trained with `threads` per process (their keys hold it where it is not COMMITTED_THREADS)."""
    return [dataclasses.replace(run, threads=threads) for run in runs]


class ResultStore:
    """`results.json` of one ablation: {"runs": [...]}, shared by every process that measures its runs,
    with no lock (cluster file systems such as Lustre and BeeGFS have none that holds across nodes).

    Each `add` writes its record atomically as a file of its own, RECORD in the run's folder
    (`record_folder`: runs/<key>-n<numerics>/, ignored by git), and record files are never deleted.
    `results.json` is the union of what it held and every record file (a record file is the latest word
    on its run; of two for one key, the later written), rewritten atomically by whoever adds or reads
    (`refresh`) when the union differs from it. Two processes writing the union at once may each miss
    the other's newest record; so each lists the record files again after writing and writes again
    until its union holds every one it sees: the last writer has seen every record file written before
    its last write, and a record file stays for the next reader in any case. `runs` is the union at
    the last read or add; `order`, if given, sorts the records as they are written (a key function of
    a record); else results.json keeps its order and new or replaced records follow, oldest first.

    A record file whose record was moved to the archive beside results.json (ARCHIVE, by
    `benchmarks.archive`) is not merged back in; a new record of the same key is.

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
        self._files: dict[Path, tuple[tuple[int, ...], dict[str, Any]]] = {}  # record file -> (its stat, record) read
        self.runs: list[dict[str, Any]] = []
        self.refresh()

    def _record_files(self) -> dict[Path, tuple[int, ...]]:
        """Every record file now, with its modification time, size and inode (an atomic write makes a new one)."""
        found = {}
        for path in self.directory.glob(f"runs/*/{RECORD}"):
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                found[path] = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        return found

    def _record(self, path: Path, seen: tuple[int, ...]) -> dict[str, Any] | None:
        """The record in a file, read again only when it changed since the last read."""
        if path not in self._files or self._files[path][0] != seen:
            try:
                self._files[path] = (seen, json.loads(path.read_text()))
            except (FileNotFoundError, json.JSONDecodeError):  # replaced meanwhile: read at the next listing
                return None
        return self._files[path][1]

    def _union(self, held: list[dict[str, Any]], files: dict[Path, tuple[int, ...]]) -> list[dict[str, Any]]:
        """What results.json held with every record file merged in: a file's record replaces the held
        one of its key (moving it to the end unless they are equal); of several files, the later written."""
        newest: dict[str, tuple[tuple[int, str], dict[str, Any]]] = {}
        archived = self._archived()
        for path, seen in files.items():
            record = self._record(path, seen)
            if record is not None and json.dumps(record, sort_keys=True) in archived:
                continue  # moved to the archive (benchmarks/archive.py): its old record file does not bring it back
            if record is not None and (record["key"] not in newest or newest[record["key"]][0] < (seen[0], str(path))):
                newest[record["key"]] = ((seen[0], str(path)), record)
        kept = [r for r in held if r["key"] not in newest or newest[r["key"]][1] == r]
        kept_keys = {r["key"] for r in kept}
        added = sorted((item for item in newest.values() if item[1]["key"] not in kept_keys), key=lambda item: item[0])
        runs = kept + [record for _, record in added]
        if self.order is not None:
            runs.sort(key=self.order)
        return runs

    def _archived(self) -> set[str]:
        """The records moved out of results.json into its archive (ARCHIVE), as canonical JSON."""
        path = self.directory / ARCHIVE
        if not path.exists():
            return set()
        return {json.dumps(entry["record"], sort_keys=True) for entry in json.loads(path.read_text())["runs"]}

    def _merge(self) -> None:
        """Make results.json the union of itself and every record file, and `runs` that union."""
        while True:
            files = self._record_files()
            held = json.loads(self.path.read_text())["runs"] if self.path.exists() else None
            self.runs = self._union(held or [], files)
            if self.runs == (held if held is not None else []):  # nothing new: the file stays as it is
                return
            write_text(self.path, json.dumps({"runs": self.runs}, indent=1, sort_keys=True) + "\n")
            if self._record_files() == files:  # none written meanwhile: the union written holds them all
                return

    def refresh(self) -> None:
        """Read the results other processes have added since (and write them into results.json)."""
        self._merge()

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
        """Store the record (replacing any of its key): its own file first, then the union."""
        write_text(record_folder(self.directory, record["key"], numerics_of(record)) / RECORD,
                   json.dumps(record, indent=1, sort_keys=True) + "\n")
        self._merge()


def make_record(run: Run, outcome: dict[str, Any], wall_s: float, device: str, **launch: Any) -> dict[str, Any]:
    """What the store keeps of a measured run: its key and settings, the numerics version of the code
    that measured it, the outcome, its wall time, how it was launched (launcher, processes, threads of
    each, `started`: the Unix time it began), and its environment."""
    return {"key": run.key, "ablation": run.ablation, "label": run.label, "group": run.group, "config": run.config,
            "seed": run.seed, "numerics": NUMERICS_VERSION, "wall_s": round(wall_s, 2), **outcome,
            **environment(device), **launch}  # the launch's threads (a worker's) over this process's


def record_folder(directory: Path, key: str, numerics: int) -> Path:
    """The folder of the run with this key measured by code of this numerics version, under a results
    directory: runs/<key>-n<numerics>/ (a key that is no plain file name is named by its hash)."""
    name = key if SAFE_NAME.fullmatch(key) else hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(directory) / "runs" / f"{name}-n{numerics}"


def run_folder(store: ResultStore, run: Run) -> Path:
    """Where a run trains and keeps its checkpoints, final weights, logs, its record and its job (ignored
    by git: runs/): one folder per numerics version, so that a run of other code, finished or not, is
    neither read as a result of this code nor resumed by it."""
    return record_folder(store.directory, run.key, NUMERICS_VERSION)


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
