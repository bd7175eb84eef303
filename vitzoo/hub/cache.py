"""Repairing the Hugging Face cache: the partial downloads a failed download leaves, and the files of
a snapshot that no longer hold what their hash says (truncated or edited on disk), are removed, so
that the next download fetches them again. vitzoo keeps no cache of its own.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from vitzoo.hub import settings


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


def _content_hash_matches(blob: Path) -> bool | None:
    """Whether a cached blob still holds what its name says: the Hugging Face cache names an LFS file's
    blob by its sha256 and a small file's by its git blob sha1. None when the name is neither."""
    import hashlib

    name = blob.name
    if re.fullmatch(r"[0-9a-f]{64}", name):
        digest = hashlib.sha256()
    elif re.fullmatch(r"[0-9a-f]{40}", name):
        digest = hashlib.sha1(f"blob {blob.stat().st_size}\0".encode())
    else:
        return None
    with open(blob, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest() == name


def evict_damaged(snapshot: str | os.PathLike) -> list[str]:
    """Remove from the cache every file of a downloaded snapshot whose content no longer matches its
    hash (truncated or edited on disk): its blob and its snapshot entry, so that the next download
    fetches it again. Returns the names of the files removed."""
    removed = []
    for entry in sorted(Path(snapshot).iterdir()):
        blob = entry.resolve()
        if entry.is_symlink() and blob.is_file() and _content_hash_matches(blob) is False:
            blob.unlink(missing_ok=True)
            entry.unlink(missing_ok=True)
            removed.append(entry.name)
    return removed
