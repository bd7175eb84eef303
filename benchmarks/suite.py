"""Runs and their results: a run keyed by a hash of its config, the results store that many
processes share with no lock, the record of a measured run with where and when it was measured
(the commit, the CPU and the instruction sets its kernels use, the GPU, torch and the threads), and
the reports' tables and figures. The code is named by NUMERICS_VERSION, stored in every record: a
record of another version is not a result of the current code, so the store does not count it.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import platform
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from vitzoo import precision
from vitzoo.io import write_text
from vitzoo.train.distributed import pick_device

RESULTS = Path(__file__).parent / "results"
# The version of training's numbers: bump it with every change that moves what a run of a given
# config and seed measures, and re-record its trace (`python -m benchmarks.numerics --record`).
NUMERICS_VERSION = 1
RECORD = "record.json"  # a run's record, in its folder: results.json is their union
# the threads per process of every committed training run; a key names any other count
COMMITTED_THREADS = 1
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def numerics_of(record: dict[str, Any]) -> int:
    return int(record.get("numerics", 0))  # 0: recorded before versions were


@dataclass(frozen=True)
class Run:
    """One measurement: a model and its training (`config`), a seed, and for a training run on
    this machine's CPU the threads of each process (a float32 sum's order depends on them)."""

    ablation: str
    label: str  # the row's name in tables and figures (not hashed)
    config: dict[str, Any]
    seed: int = 0
    group: dict[str, Any] = field(default_factory=dict)  # the cell's coordinates
    threads: int | None = None

    @property
    def key(self) -> str:
        fields = {"ablation": self.ablation, "config": self.config, "seed": self.seed}
        if self.threads is not None and self.threads != COMMITTED_THREADS:
            fields["threads"] = self.threads
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


class ResultStore:
    """An ablation's results.json, shared with no lock (a cluster's file system may hold none):
    `add` writes a record as a file of its own in its run's folder, and results.json is the union
    of what it held and every record file (of two for one key, the later), rewritten by whoever
    reads a union that differs, until the record files stay put while it writes. `numerics`: the
    version whose records count (None: every record)."""

    def __init__(self, directory: Path, numerics: int | None = NUMERICS_VERSION) -> None:
        self.directory, self.numerics = Path(directory), numerics
        self.path = self.directory / "results.json"
        self.runs: list[dict[str, Any]] = []
        self.refresh()

    def _record_files(self) -> dict[Path, tuple[int, ...]]:
        found = {}
        for path in self.directory.glob(f"runs/*/{RECORD}"):
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                found[path] = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        return found

    def refresh(self) -> None:
        """Read what other processes added, and write results.json anew if it lacks any of it."""
        while True:
            files = self._record_files()
            held = json.loads(self.path.read_text())["runs"] if self.path.exists() else []
            newest: dict[str, dict[str, Any]] = {}
            for path in sorted(files, key=lambda p: (files[p][0], str(p))):  # oldest first
                with contextlib.suppress(FileNotFoundError, ValueError):  # replaced meanwhile
                    record = json.loads(path.read_text())
                    newest.pop(record["key"], None)
                    newest[record["key"]] = record
            kept = [r for r in held if newest.get(r["key"], r) == r]
            kept_keys = {r["key"] for r in kept}
            self.runs = kept + [r for key, r in newest.items() if key not in kept_keys]
            if self.runs == held:
                return
            write_text(self.path, json.dumps({"runs": self.runs}, indent=1, sort_keys=True) + "\n")
            if self._record_files() == files:
                return

    def get(self, key: str) -> dict[str, Any] | None:
        """The record of this key, if it is one of the store's numerics version."""
        return next((r for r in self.runs if r["key"] == key and self._counts(r)), None)

    def keys(self) -> set[str]:
        return {r["key"] for r in self.runs if self._counts(r)}

    def _counts(self, record: dict[str, Any]) -> bool:
        return self.numerics is None or numerics_of(record) == self.numerics

    def add(self, record: dict[str, Any]) -> None:
        folder = record_folder(self.directory, record["key"], numerics_of(record))
        write_text(folder / RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n")
        self.refresh()


# what oneDNN's and PyTorch's kernels dispatch on: two CPUs of one name can differ here
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_fp16", "sve", "bf16")


def cpu_model() -> str:
    """The CPU's name and family (Linux: /proc/cpuinfo), e.g. "AMD EPYC (family 25)"."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(tuple(s.strip() for s in line.split(":", 1)) for line in lines if ":" in line)
    name = fields.get("model name", platform.machine())
    return f"{name} (family {fields['cpu family']})" if "cpu family" in fields else name


def git_commit() -> str:
    """The checkout's commit, -dirty with uncommitted changes outside the results."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).parent, check=True).stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                    ":(top,exclude)benchmarks/results")
        return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(device: str) -> dict[str, Any]:
    where = pick_device(device) if torch.cuda.is_available() else torch.device("cpu")
    gpu = {"gpu": torch.cuda.get_device_name(where)} if where.type == "cuda" else {}
    return {"device": device, **gpu, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": cpu_model(), "cpu_flags": [f for f in CPU_FLAGS if f in precision.cpu_flags()],
            "commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}



def make_record(run: Run, outcome: dict[str, Any], wall_s: float, device: str,
                **launch: Any) -> dict[str, Any]:
    """A measured run: its settings, numerics version, outcome, wall time, launch and machine."""
    return {"key": run.key, "ablation": run.ablation, "label": run.label, "group": run.group,
            "config": run.config, "seed": run.seed, "numerics": NUMERICS_VERSION,
            "wall_s": round(wall_s, 2), **outcome, **environment(device), **launch}


def record_folder(directory: Path, key: str, numerics: int) -> Path:
    """runs/<key>-n<numerics>/ under a results folder (a key that is no file name: its hash)."""
    name = key if SAFE_NAME.fullmatch(key) else hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(directory) / "runs" / f"{name}-n{numerics}"


def run_folder(store: ResultStore, run: Run) -> Path:
    """Where a run trains, one folder per numerics version: other code's is never resumed."""
    return record_folder(store.directory, run.key, NUMERICS_VERSION)


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows])


def markdown_image(name: str) -> str:
    return f"![{Path(name).stem.replace('_', ' ')}]({name})"


def save_figure(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    os.replace(tmp, path)


def _proc_status_gb(name: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(name + ":")) / 2**20


def peak_memory_growth_gb(fn: Callable[[], object]) -> float:
    """Peak resident memory while `fn` runs above what the process held before (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the high-water mark
    before = _proc_status_gb("VmRSS")
    fn()
    return _proc_status_gb("VmHWM") - before
