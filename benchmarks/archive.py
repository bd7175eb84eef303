"""Housekeeping of an ablation's results store: records that no longer stand for the table's runs move
out of results.json into an archive beside it (superseded.json), each with the reason, so that anyone
recomputing a table by label from results.json gets the table's numbers, and nothing is thrown away;
and the threads a record says are corrected where they were recorded wrong (`correct_threads`).

A record is superseded when its key is not the key of any run the spec plans at the scale its table
was measured at (other settings under a label still in use: earlier epochs, learning rates, subset
sizes, or a config since nested differently), or when it was measured by uncommitted code (a commit
ending in -dirty: no one can say which code measured it). The committed runs' keys are untouched:
what results.json keeps loads, and means, what it did.

    python -m benchmarks.archive [ABLATION ...] [--because TEXT]   # every ablation with a findings.json by default
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from benchmarks.suite import ARCHIVE, RECORD, RESULTS, Run, numerics_of, record_folder
from vitzoo.io import write_text

# the archive beside results.json (ARCHIVE): {"runs": [{"reason": ..., "record": {...}}, ...]}


def differences(old: Any, new: Any, where: str = "") -> list[str]:
    """The settings that differ between two configs, as `path: old -> new` (nested dicts walked)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new), key=str)
                for d in differences(old.get(key, "(unset)"), new.get(key, "(unset)"), f"{where}.{key}" if where else str(key))]
    return [] if old == new else [f"{where}: {json.dumps(old)} -> {json.dumps(new)}"]


def superseded(records: Iterable[dict], planned: Iterable[Run], scale: str) -> list[tuple[dict, str]]:
    """The records that no longer stand for the planned runs, each with why."""
    keys = {run.key for run in planned}
    by_label = {run.label: run for run in planned}
    out = []
    for record in records:
        if str(record.get("commit", "")).endswith("-dirty"):
            out.append((record, f"measured by uncommitted code (commit {record['commit']}): no one can say which code"))
        elif record["key"] not in keys:
            run = by_label.get(record.get("label"))
            if run is None:
                why = f"no cell of --scale {scale} is labelled {record.get('label')!r} any more"
            else:
                changed = differences(record.get("config"), run.config)
                why = (f"other settings than --scale {scale}'s run of {run.label!r} (seed {record.get('seed')}): "
                       + ("; ".join(changed) if changed else "the key hashes the config differently"))
            out.append((record, why))
    return out


def archive(folder: Path, planned: list[Run], scale: str, because: str = "") -> int:
    """Move the superseded records of the store in `folder` into its archive (appended, each once), and
    rewrite results.json without them; both written atomically. `because`: why the settings changed (e.g.
    the issue that changed the measure), put before each record's differences. Returns how many moved."""
    path, kept_path = folder / "results.json", folder / ARCHIVE
    records = json.loads(path.read_text())["runs"]
    moving = [(r, f"{because}: {why}" if because else why) for r, why in superseded(records, planned, scale)]
    if not moving:
        return 0
    archived = json.loads(kept_path.read_text())["runs"] if kept_path.exists() else []
    already = {json.dumps(entry["record"], sort_keys=True) for entry in archived}
    archived += [{"reason": why, "record": r} for r, why in moving if json.dumps(r, sort_keys=True) not in already]
    gone = {id(r) for r, _ in moving}
    # the archive first: a record is never in neither file
    write_text(kept_path, json.dumps({"runs": archived}, indent=1, sort_keys=True) + "\n")
    write_text(path, json.dumps({"runs": [r for r in records if id(r) not in gone]}, indent=1, sort_keys=True) + "\n")
    return len(moving)


# The commit from which a run measured by a worker of a pool records the threads it trained with; before it,
# every record said the launching process's threads (2 on the 2-core CPU), whatever each run trained with.
THREADS_RECORDED_FROM = "8abe73c"


def before_threads_were_recorded(commit: str) -> bool:
    """Whether `commit` (a record's) predates THREADS_RECORDED_FROM in this checkout's history."""
    commit = commit.removesuffix("-dirty")
    if commit in ("", "unknown") or THREADS_RECORDED_FROM.startswith(commit) or commit.startswith(THREADS_RECORDED_FROM):
        return False
    found = subprocess.run(["git", "merge-base", "--is-ancestor", commit, THREADS_RECORDED_FROM],
                           cwd=Path(__file__).parent, capture_output=True)
    if found.returncode not in (0, 1):
        raise RuntimeError(f"git cannot place commit {commit!r} (a shallow clone?): {found.stderr.decode().strip()}")
    return found.returncode == 0


def at_once(record: dict, records: list[dict]) -> int:
    """The most runs of the store that trained at once at some moment of this one's run (itself included),
    from their start times and wall times."""
    start, end = record["started"], record["started"] + record["wall_s"]
    spans = [(r["started"], r["started"] + r["wall_s"]) for r in records if "started" in r and "wall_s" in r]
    moments = [start] + [s for s, _ in spans if start <= s < end]
    return max(sum(s <= t < e for s, e in spans) for t in moments)


def correct_threads(records: list[dict], before: Callable[[str], bool] = before_threads_were_recorded) -> int:
    """Set the threads a record says to those its run trained with, where the record predates their
    recording (`before(commit)`) and its run went beside others in one pool of local CPU workers: the
    launching process's threads shared among the runs at once (each worker set torch's threads to its
    share). The recorded number is kept as `threads_recorded`, with why it changed. Returns how many changed."""
    changed = 0
    for r in records:
        if "threads_recorded" in r or "started" not in r or r.get("launcher") != "local" or r.get("processes") != 1:
            continue
        if r.get("device") != "cpu" or not before(str(r.get("commit", ""))):
            continue
        share = max(1, r["threads"] // at_once(r, records))
        if share != r["threads"]:
            r["threads_recorded"], r["threads"] = r["threads"], share
            r["threads_note"] = (f"recorded as the launching process's {r['threads_recorded']} by code before "
                                 f"{THREADS_RECORDED_FROM}; {at_once(r, records)} runs trained at once, each worker with "
                                 f"{share} thread(s)")
            changed += 1
    return changed


def archived_records(folder: Path) -> list[dict]:
    """The records archived beside a store (none without an archive)."""
    path = Path(folder) / ARCHIVE
    return [entry["record"] for entry in json.loads(path.read_text())["runs"]] if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    from benchmarks.ablations import ABLATIONS
    from benchmarks.scales import SCALES

    argv = list(argv if argv is not None else sys.argv[1:])
    because = ""
    if "--because" in argv:  # --because TEXT: why the settings changed, before each record's differences
        at = argv.index("--because")
        if at + 1 >= len(argv) or not argv[at + 1].strip():
            raise SystemExit("--because takes the reason the settings changed, e.g. --because 'the rate is picked on validation'")
        because = argv[at + 1]
        del argv[at:at + 2]
    names = argv or [n for n in ABLATIONS if (RESULTS / n / "findings.json").exists()]
    for name in names:
        folder = RESULTS / name
        scale = json.loads((folder / "findings.json").read_text())["scale"]
        moved = archive(folder, ABLATIONS[name].runs(SCALES[scale]), scale, because)
        records = json.loads((folder / "results.json").read_text())["runs"]
        fixed = correct_threads(records)
        if fixed:
            for r in records:  # a run folder's own record file (git-ignored) says the same, or it would win the union
                if "threads_recorded" in r and (own := record_folder(folder, r["key"], numerics_of(r)) / RECORD).exists():
                    write_text(own, json.dumps(r, indent=1, sort_keys=True) + "\n")
            write_text(folder / "results.json", json.dumps({"runs": records}, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {moved} superseded records moved to {folder / ARCHIVE}; threads corrected in {fixed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
