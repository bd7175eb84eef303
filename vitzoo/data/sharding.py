"""An ImageFolder written as WebDataset tar shards (`vitzoo shard FOLDER OUT`).

Each split (train/, and val/ or test/) becomes `OUT/<split>-000000.tar`, ...: its images in the
order training lists them, each the file's own bytes (`.JPEG` as `.jpg`) and its class (`.cls`),
`shard_mb` megabytes (one sample at least) or `samples_per_shard` samples a shard, each renamed
into place once written. `OUT/_info.json`, timm's listing with the class names, comes last. Run
again after a stop: the complete shards of the same plan (a digest of the files) are kept.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vitzoo.data.folders import FolderImages, _folder_split, check_data
from vitzoo.data.shards import INFO_FILES, load_index
from vitzoo.errors import DataError
from vitzoo.io import atomic_path, write_text
from vitzoo.options import check_number

MB = 1_000_000
DEFAULT_SHARD_MB = 1000  # ~1 GB: ImageNet-1k's training set in ~140 shards
INFO, PLAN = INFO_FILES[0], ".vitzoo-shard-plan.json"
# what vitzoo writes in OUT: shards, their indexes, the info, the plan, and their temporary names
_OURS = re.compile(r"^\.?((train|val|validation|test)-\d{6}\.tar|_info\.json|"
                   r"\.vitzoo-shard-plan\.json)(\.[0-9a-f]{12}\.tmp)?$")


def _shard_bounds(sizes: list[int], shard_mb: float, samples_per_shard: int | None) -> list[int]:
    """The first sample of each shard, and the end: a shard's tar (per sample the image's header
    and blocks and the .cls member's, two zero blocks, a record of 20 blocks) stays within
    `shard_mb` unless it holds one sample."""
    if samples_per_shard:
        return [*range(0, len(sizes), samples_per_shard), len(sizes)]
    bounds, content = [0], 0
    for i, size in enumerate(sizes):
        grows = 1536 + -(-size // 512) * 512
        if i > bounds[-1] and -(-(content + grows + 1024) // 10240) * 10240 > shard_mb * MB:
            bounds.append(i)
            content = 0
        content += grows
    return [*bounds, len(sizes)]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def plan_shards(folder: Path, shard_mb: float, samples_per_shard: int | None, pool) -> dict:
    """What goes where: per split its images (paths, labels, sizes) and its shards' boundaries,
    the class names, and a digest of all of it (what a resumed run must find unchanged)."""
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; give an ImageFolder tree "
                        "(FOLDER/train/<class>/<images> and FOLDER/val/...)")
    check_data(str(folder.resolve()))
    plan: dict = {"splits": {}}
    digest = hashlib.sha256()
    for split in ("train", "test"):
        split_dir = _folder_split(folder, split)
        listed = FolderImages(split_dir)
        if plan.setdefault("classes", listed.classes) != listed.classes:
            raise DataError(f"{split_dir} and {folder}/train hold different class folders: give "
                            "both splits the same classes")
        stats = []
        for start in range(0, len(listed), 10_000):  # a chunk at a time, not millions of futures
            stats += [(s.st_size, s.st_mtime_ns)
                      for s in pool.map(os.stat, listed.paths[start:start + 10_000])]
        sizes, labels = [s for s, _ in stats], listed.targets.tolist()
        bounds = _shard_bounds(sizes, shard_mb, samples_per_shard)
        cut = len(str(split_dir)) + 1
        for path, (size, mtime), label in zip(listed.paths, stats, labels):
            digest.update(f"{split_dir.name}/{path[cut:]}\t{size}\t{mtime}\t{label}\n".encode())
        digest.update(f"{listed.classes} {bounds}\n".encode())
        plan["splits"][split_dir.name] = dict(paths=listed.paths, labels=labels, sizes=sizes,
                                              bounds=bounds)
    return {**plan, "digest": digest.hexdigest(), "source": str(folder.resolve())}


def _info(plan: dict) -> dict:
    splits = {name: {"name": name, "num_samples": len(s["paths"]),
                     "filenames": [f"{name}-{n:06d}.tar" for n in range(len(s["bounds"]) - 1)],
                     "shard_lengths": [b - a for a, b in zip(s["bounds"], s["bounds"][1:])]}
              for name, s in plan["splits"].items()}
    return {"name": Path(plan["source"]).name, "classes": plan["classes"], "splits": splits,
            "vitzoo": {"digest": plan["digest"], "source": plan["source"]}}


def _write_shard(path: Path, split: dict, first: int, stop: int, pool, progress) -> None:
    """Write samples first..stop - 1 of a split as the shard `path`, renamed into place."""
    width = max(8, len(str(len(split["paths"]) - 1)))
    with atomic_path(path) as tmp, tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for start in range(first, stop, 64):  # 64 files read at once, in order
            numbers = range(start, min(start + 64, stop))
            for number, data in zip(numbers, pool.map(_read, split["paths"][start:numbers.stop])):
                file = Path(split["paths"][number])
                if len(data) != split["sizes"][number]:
                    raise DataError(f"{file} changed while it was sharded: run `vitzoo shard` "
                                    "again once the folder is not being written")
                key = f"{number:0{width}d}_{re.sub(r'[^A-Za-z0-9_-]', '_', file.stem)[:64]}"
                suffix = ".jpg" if file.suffix.lower() == ".jpeg" else file.suffix.lower()
                for name, payload in ((key + suffix, data),
                                      (key + ".cls", str(split["labels"][number]).encode())):
                    member = tarfile.TarInfo(name)
                    member.size = len(payload)
                    tar.addfile(member, io.BytesIO(payload))
                progress.update(len(data))
    load_index(path)  # indexed now, while its headers are in the page cache


def _digest(path: Path) -> str | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))["vitzoo"]["digest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_shards(folder, out, shard_mb: float = DEFAULT_SHARD_MB,
                 samples_per_shard: int | None = None, overwrite: bool = False, threads: int = 8,
                 progress: bool = True) -> dict:
    """Write the ImageFolder `folder` as shards in `out`, or finish an interrupted run; returns the
    info written (`out/_info.json`). OUT must be new or empty, or hold shards of the same plan;
    `overwrite` writes beside other files and replaces earlier shards."""
    from tqdm import tqdm

    check_number("shard_mb", shard_mb, float, "> 0")
    if samples_per_shard is not None:
        check_number("samples_per_shard", samples_per_shard, int, "> 0")
    folder, out = Path(folder), Path(out)
    with ThreadPoolExecutor(threads) as pool:
        plan = plan_shards(folder, shard_mb, samples_per_shard, pool)
        where, source = out.resolve(), folder.resolve()
        if where == source or any(d == where or d in where.parents
                                  for d in (source / split for split in plan["splits"])):
            raise DataError(f"{out} is inside the folder being sharded; write the shards beside it")
        out.mkdir(parents=True, exist_ok=True)
        present = {p.name for p in out.iterdir()}
        others = sorted(n for n in present if not _OURS.match(n))
        if others and not overwrite:
            raise DataError(f"{out} holds files that are not vitzoo's shards "
                            f"({', '.join(others[:3])}): choose a new or empty folder, or pass "
                            "--overwrite")
        same = plan["digest"] in (_digest(out / INFO), _digest(out / PLAN))
        if not same and present - set(others) and not overwrite:
            raise DataError(f"{out} holds shards of another folder or shard size: pass --overwrite "
                            "to replace them, or choose another folder")
        for name in present - set(others):  # a killed run's temporary files, or replaced shards
            if not same or name.endswith(".tmp"):
                (out / name).unlink()
        info = _info(plan)
        todo = [(out / file, split, a, b) for name, split in plan["splits"].items()
                for file, a, b in zip(info["splits"][name]["filenames"], split["bounds"],
                                      split["bounds"][1:]) if not (out / file).is_file()]
        if same and not todo and _digest(out / INFO):
            return info
        write_text(out / PLAN, json.dumps(info))
        total = sum(sum(s["sizes"]) for s in plan["splits"].values())
        left = sum(sum(split["sizes"][a:b]) for _, split, a, b in todo)
        with tqdm(total=total, initial=total - left, unit="B", unit_scale=True,
                  disable=not progress, desc=f"shard {folder.name}") as bar:
            for path, split, first, stop in todo:
                _write_shard(path, split, first, stop, pool, bar)
    for name in info["splits"].values():  # the complete shards kept from a stopped run: indexed
        for file in name["filenames"]:
            load_index(out / file)
    write_text(out / INFO, json.dumps(info, indent=1))
    (out / PLAN).unlink()
    return info
