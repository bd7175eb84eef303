"""The JSON the API speaks: repo info, tree listings, refs and commit lists out; NDJSON commits in."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .lfs import lfs_tree_file
from .model import (
    AddFile,
    Commit,
    DeleteFile,
    DeleteFolder,
    FileEntry,
    ErrorAnswer,
    Operation,
    RepoMeta,
    TreeFile,
    entry_not_found,
    git_blob_sha1,
    validate_repo_path,
)

if TYPE_CHECKING:
    from .store import HubStore


# ----------------------------------------------------------------------------------------------------
# Answers


def _lfs_json(entry: FileEntry, oid_key: str) -> dict[str, Any]:
    return {oid_key: entry.sha256, "size": entry.size, "pointerSize": len(entry.pointer)}


def _tree_file_json(path: str, tree_file: TreeFile) -> dict[str, Any]:
    entry = tree_file.entry
    item: dict[str, Any] = {"type": "file", "oid": tree_file.oid, "size": entry.size, "path": path}
    if entry.lfs:
        item["lfs"] = _lfs_json(entry, "oid")
    return item


def _folder_oid(files: Mapping[str, TreeFile], folder: str) -> str:
    # Not git's tree hash (that needs git's tree encoding), but stable and content-derived the same way.
    listing = "".join(
        f"{path}\0{tree_file.oid}\n" for path, tree_file in sorted(files.items()) if path.startswith(folder + "/")
    )
    return hashlib.sha1(listing.encode()).hexdigest()


def tree_listing(files: Mapping[str, TreeFile], folder: str, recursive: bool, commit_id: str) -> list[dict[str, Any]]:
    """The `/tree` answer: the entries under `folder` ("" for the root), folders and files."""
    base = f"{folder}/" if folder else ""
    under = {path: tree_file for path, tree_file in files.items() if path.startswith(base)}
    if folder and not under:
        if folder in files:
            return [_tree_file_json(folder, files[folder])]
        raise entry_not_found(folder, commit_id)
    folders: set[str] = set()
    items = []
    for path, tree_file in under.items():
        parts = path[len(base) :].split("/")
        depth_limit = len(parts) - 1 if recursive else min(1, len(parts) - 1)
        folders.update(base + "/".join(parts[: depth + 1]) for depth in range(depth_limit))
        if recursive or len(parts) == 1:
            items.append(_tree_file_json(path, tree_file))
    items += [{"type": "directory", "oid": _folder_oid(files, name), "size": 0, "path": name} for name in folders]
    return sorted(items, key=lambda item: item["path"])


def repo_info_json(meta: RepoMeta, commit: Commit) -> dict[str, Any]:
    """The `/api/{type}s/{repo}` answer (enough of ModelInfo / DatasetInfo / SpaceInfo)."""
    siblings = []
    for path, tree_file in sorted(commit.files.items()):
        sibling: dict[str, Any] = {"rfilename": path, "size": tree_file.entry.size, "blobId": tree_file.oid}
        if tree_file.entry.lfs:
            sibling["lfs"] = _lfs_json(tree_file.entry, "sha256")
        siblings.append(sibling)
    return {
        "_id": hashlib.sha1(meta.key.url_path.encode()).hexdigest()[:24],
        "id": meta.key.repo_id,
        "author": meta.key.namespace,
        "sha": commit.id,
        "private": meta.private,
        "gated": False,
        "disabled": False,
        "createdAt": meta.created_at,
        "lastModified": commit.date,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
        "usedStorage": sum(tree_file.entry.size for tree_file in commit.files.values()),
    }


def refs_json(refs: Mapping[str, str]) -> dict[str, Any]:
    def infos(prefix: str, keep_prefix: bool = False) -> list[dict[str, str]]:
        return [
            {"name": ref if keep_prefix else ref[len(prefix) :], "ref": ref, "targetCommit": target}
            for ref, target in sorted(refs.items())
            if ref.startswith(prefix)
        ]

    return {
        "branches": infos("refs/heads/"),
        "tags": infos("refs/tags/"),
        "converts": [],
        "pullRequests": infos("refs/pr/", keep_prefix=True),
    }


def commit_json(commit: Commit) -> dict[str, Any]:
    return {
        "id": commit.id,
        "title": commit.title,
        "message": commit.message,
        "date": commit.date,
        "authors": [{"user": commit.author}],
    }


# ----------------------------------------------------------------------------------------------------
# Commit payload


def parse_operations(store: HubStore, lines: Iterable[bytes]) -> tuple[dict[str, Any], list[Operation]]:
    """Parse an NDJSON commit body into its header and operations, storing inline file contents."""
    header: dict[str, Any] | None = None
    operations: list[Operation] = []
    for raw in lines:
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
            key, value = item["key"], item["value"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ErrorAnswer(400, f"Malformed commit line: {exc}") from None
        if key == "header":
            header = value
        else:
            operations.append(_parse_operation(store, key, value))
    if header is None:
        raise ErrorAnswer(400, "The commit payload has no header line")
    return header, operations


def _parse_operation(store: HubStore, key: str, value: Mapping[str, Any]) -> Operation:
    path = validate_repo_path(value.get("path"))
    if key == "file":
        content = value.get("content", "")
        try:
            data = base64.b64decode(content, validate=True) if value.get("encoding") == "base64" else content.encode()
        except (binascii.Error, AttributeError):
            raise ErrorAnswer(400, f"Invalid content for {path}") from None
        entry = store.put_bytes(data)
        return AddFile(path, TreeFile(entry, git_blob_sha1(data)))
    if key == "lfsFile":
        return AddFile(path, lfs_tree_file(store, path, value))
    if key == "deletedFile":
        return DeleteFile(path)
    if key == "deletedFolder":
        return DeleteFolder(path)
    raise ErrorAnswer(400, f"Unknown commit operation {key!r}")
