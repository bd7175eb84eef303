"""Git LFS: which files go through it, signed upload URLs, batch answers and `lfsFile` commit entries."""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .model import Commit, ErrorAnswer, FileEntry, TreeFile, git_blob_sha1, is_sha256, validate_repo_path

if TYPE_CHECKING:
    from .store import HubStore

#: Files at least this large are uploaded through LFS (the real Hub uses 10 MB too).
LFS_SIZE_THRESHOLD = 10 * 1024 * 1024
UPLOAD_URL_TTL_SECONDS = 3600


# ----------------------------------------------------------------------------------------------------
# Upload mode (preupload)


def sample_is_binary(sample: bytes) -> bool:
    """Whether a file's first bytes look binary: a NUL byte, or bytes that are not UTF-8."""
    if b"\0" in sample:
        return True
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        # The 512-byte sample may cut a multi-byte character in two: a truncated tail is still text.
        return exc.reason != "unexpected end of data"
    return False


def lfs_patterns(gitattributes: str) -> list[str]:
    """The patterns that a .gitattributes file routes through the LFS filter."""
    patterns = []
    for line in gitattributes.splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#") and "filter=lfs" in fields[1:]:
            patterns.append(fields[0])
    return patterns


def matches_any(path: str, patterns: Iterable[str]) -> bool:
    """gitattributes matching: a pattern without "/" matches the basename at any depth."""
    basename = path.rsplit("/", 1)[-1]
    for pattern in patterns:
        anchored = "/" in pattern.rstrip("/")
        if fnmatch.fnmatchcase(path if anchored else basename, pattern.lstrip("/")):
            return True
    return False


def upload_modes(store: HubStore, commit: Commit, items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The preupload answer for each file: "lfs" or "regular", by the rule of the package docstring."""
    attributes = commit.files.get(".gitattributes")
    patterns = lfs_patterns(store.read_blob(attributes.entry.sha256).decode("utf-8", "replace")) if attributes else []
    return [_upload_mode(item, commit, patterns) for item in items]


def _upload_mode(item: Mapping[str, Any], commit: Commit, patterns: list[str]) -> dict[str, Any]:
    path, size = validate_repo_path(item.get("path")), int(item.get("size") or 0)
    try:
        sample = base64.b64decode(item.get("sample") or "")
    except binascii.Error:
        raise ErrorAnswer(400, f"Invalid sample for {path}") from None
    lfs = size > 0 and (size >= LFS_SIZE_THRESHOLD or sample_is_binary(sample) or matches_any(path, patterns))
    answer: dict[str, Any] = {"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
    existing = commit.files.get(path)
    if existing is not None and existing.entry.lfs == lfs:
        # The client skips files whose oid (sha256 for LFS, git sha1 otherwise) is unchanged.
        answer["oid"] = existing.entry.sha256 if lfs else existing.oid
    return answer


# ----------------------------------------------------------------------------------------------------
# Batch API and signed upload URLs
#
# The client PUTs to upload URLs without its token, as to presigned S3 URLs, so the URLs carry an HMAC
# of (oid, size, expiry) under a per-process secret, and expire after an hour.


def _upload_signature(secret: bytes, oid: str, size: int, expires: int) -> str:
    return hmac.new(secret, f"{oid}:{size}:{expires}".encode(), hashlib.sha256).hexdigest()


def batch_object(store: HubStore, item: Mapping[str, Any], objects_url: str, secret: bytes) -> dict[str, Any]:
    """One object of an upload batch answer: an error, nothing to do (stored), or upload/verify actions."""
    oid, size = item.get("oid"), item.get("size")
    if not is_sha256(oid) or not isinstance(size, int) or size < 0:
        return {
            "oid": str(oid),
            "size": size if isinstance(size, int) else 0,
            "error": {"code": 422, "message": "oid must be a sha256 hex digest and size an integer"},
        }
    if store.has_blob(oid, size):
        return {"oid": oid, "size": size}  # already stored: no actions, the client skips the upload
    expires = int(time.time()) + UPLOAD_URL_TTL_SECONDS
    signature = _upload_signature(secret, oid, size, expires)
    return {
        "oid": oid,
        "size": size,
        "authenticated": True,
        "actions": {
            "upload": {
                "href": f"{objects_url}/{oid}?size={size}&expires={expires}&signature={signature}",
                "expires_in": UPLOAD_URL_TTL_SECONDS,
            },
            "verify": {"href": f"{objects_url}/verify"},
        },
    }


def signed_upload_size(oid: str, query: Mapping[str, list[str]], secret: bytes) -> int:
    """The size an upload URL's signature vouches for; 403 if unsigned, forged or expired."""
    try:
        size, expires = int(query["size"][0]), int(query["expires"][0])
        signature = query["signature"][0]
    except (KeyError, ValueError):
        raise ErrorAnswer(403, "LFS upload URL is not signed: ask the batch endpoint for one") from None
    valid = hmac.compare_digest(signature, _upload_signature(secret, oid, size, expires))
    if not valid or expires < time.time():
        raise ErrorAnswer(403, "LFS upload URL is invalid or expired")
    return size


# ----------------------------------------------------------------------------------------------------
# Commits


def lfs_tree_file(store: HubStore, path: str, value: Mapping[str, Any]) -> TreeFile:
    """The file an `lfsFile` commit entry adds: its object must have been uploaded (and verified) before."""
    oid = value.get("oid")
    if value.get("algo", "sha256") != "sha256" or not is_sha256(oid):
        raise ErrorAnswer(400, f"Invalid LFS oid for {path}: {oid!r}")
    if not store.has_blob(oid):
        raise ErrorAnswer(400, f"LFS object {oid} for {path} was never uploaded (or failed verification)")
    size = store.blob_path(oid).stat().st_size
    if value.get("size") is not None and value["size"] != size:  # copies of LFS files omit the size
        raise ErrorAnswer(400, f"LFS object {oid} has {size} bytes, not {value['size']}")
    entry = FileEntry(oid, size, lfs=True)
    return TreeFile(entry, git_blob_sha1(entry.pointer))
