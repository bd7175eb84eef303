"""Repairing the Hugging Face cache: the partial downloads a failed download leaves are removed, and
the files of a snapshot that no longer hold what their hash says (a flipped bit, an edit, a
truncation on disk) are found, so that they are never loaded and are downloaded again. vitzoo keeps no
cache of its own, only a note of the blobs it has verified (STAMPS_NAME).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from vitzoo.hub import settings
from vitzoo.io import write_text


def remove_partial_downloads(repo_id: str, cache_dir: str | os.PathLike | None) -> None:
    """Delete the `.incomplete` blobs a failed download left in this repo's cache folder, each under
    the lock huggingface_hub takes for it (a concurrent download of the same file keeps its own)."""
    from filelock import FileLock, Timeout
    from huggingface_hub.file_download import repo_folder_name

    cache = Path(cache_dir or settings.constants().HF_HUB_CACHE)
    folder = repo_folder_name(repo_id=repo_id, repo_type="model")
    blobs = cache / folder / "blobs"
    if not blobs.is_dir():
        return
    for partial in blobs.glob("*.incomplete"):
        etag = partial.name.split(".", 1)[0]
        lock = cache / ".locks" / folder / f"{etag}.lock"
        try:
            with FileLock(str(lock), timeout=0):
                partial.unlink(missing_ok=True)
        except (Timeout, OSError):
            pass  # another process is downloading it right now


def hash_matches_name(blob: Path) -> bool | None:
    """Whether a cached blob still holds what its name says: the Hugging Face cache names a blob by the
    ETag the Hub sent, an LFS file's sha256 or a small file's git blob sha1 (hashed here with
    huggingface_hub's own functions). None when the name is neither."""
    from huggingface_hub.utils.sha import git_hash, sha_fileobj

    if re.fullmatch(r"[0-9a-f]{64}", blob.name):
        with open(blob, "rb") as f:
            return sha_fileobj(f).hex() == blob.name
    if re.fullmatch(r"[0-9a-f]{40}", blob.name):
        return git_hash(blob.read_bytes()) == blob.name
    return None


# Blobs whose hash matched, by name, with the state of the file then (size, mtime, ctime, inode): a blob
# is hashed again only when its file changed. One small JSON file in the repo's cache folder, beside
# huggingface_hub's blobs/, refs/ and snapshots/; where it cannot be written, blobs are hashed at every load.
STAMPS_NAME = "vitzoo-verified.json"


def _file_state(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_stamps(path: Path) -> dict[str, list[int]]:
    try:
        stamps = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return stamps if isinstance(stamps, dict) else {}


def damaged_files(snapshot: str | os.PathLike) -> list[str]:
    """The files of a downloaded snapshot whose blob no longer holds what its hash says (changed on disk
    after the download: a failing disk, an edit, a truncation). Each blob is hashed once per file
    state; the blobs that matched are remembered in STAMPS_NAME."""
    snapshot = Path(snapshot)
    stamps_path = snapshot.parent.parent / STAMPS_NAME
    stamps = _read_stamps(stamps_path)
    damaged, changed = [], False
    for entry in sorted(p for p in snapshot.rglob("*") if p.is_file()):
        blob = entry.resolve()
        state = _file_state(blob)
        if stamps.get(blob.name) == state:
            continue
        matches = hash_matches_name(blob)
        if matches is False:
            damaged.append(entry.relative_to(snapshot).as_posix())
            changed |= stamps.pop(blob.name, None) is not None
        elif matches:
            stamps[blob.name], changed = state, True
    if changed:
        try:
            write_text(stamps_path, json.dumps(stamps, sort_keys=True) + "\n")
        except OSError:
            pass  # a read-only cache: hashed again next time
    return damaged


def evict(snapshot: str | os.PathLike, names: list[str]) -> None:
    """Remove these files of a snapshot from the cache, blob and snapshot entry, so that the next
    download fetches them again (huggingface_hub fetches what a snapshot lacks)."""
    for name in names:
        entry = Path(snapshot) / name
        blob = entry.resolve()
        if blob != entry:
            blob.unlink(missing_ok=True)
        entry.unlink(missing_ok=True)


def describe(snapshot: str | os.PathLike, names: list[str], where: str) -> str:
    """What is wrong with these damaged files of a snapshot, in words, naming the hash each should have."""
    said = []
    for name in names:
        blob = (Path(snapshot) / name).resolve()
        kind = "sha256" if len(blob.name) == 64 else "git blob sha1" if len(blob.name) == 40 else "hash"
        said.append(f"the cached {name} of {where} is damaged: its bytes no longer hash to the {kind} "
                    f"{blob.name[:12]}... its blob is named by in the Hugging Face cache ({blob.parent.parent})")
    return "; ".join(said) + ". It changed on disk after the download (a failing disk, an edit)"
