"""The data model: which repo, what a commit holds, the errors answered to clients, and naming rules."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

REPO_TYPES = ("model", "dataset", "space")
URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}
DEFAULT_BRANCH = "main"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


# ----------------------------------------------------------------------------------------------------
# Errors


class ErrorAnswer(Exception):
    """An error answered to the client: HTTP status, message and optional `X-Error-Code`."""

    def __init__(
        self, status: int, message: str, *, code: str | None = None, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


def repo_not_found(repo_id: str, status: int = 404) -> ErrorAnswer:
    return ErrorAnswer(status, f"Repository not found: {repo_id}", code="RepoNotFound")


def revision_not_found(revision: str) -> ErrorAnswer:
    return ErrorAnswer(404, f"Invalid rev id: {revision}", code="RevisionNotFound")


def entry_not_found(path: str, commit_id: str, message: str | None = None) -> ErrorAnswer:
    # X-Repo-Commit lets the client cache the file's absence for that commit.
    message = message or f"Entry not found: {path}"
    return ErrorAnswer(404, message, code="EntryNotFound", headers={"X-Repo-Commit": commit_id})


# ----------------------------------------------------------------------------------------------------
# Repos, files and commits


@dataclass(frozen=True)
class RepoKey:
    """Which repository: its type ("model", "dataset", "space"), namespace and name."""

    type: str
    namespace: str
    name: str

    @property
    def repo_id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def url_path(self) -> str:
        """The repo's path in web URLs, e.g. "datasets/alice/data"."""
        return f"{URL_PREFIXES[self.type]}{self.repo_id}"

    def validate(self) -> RepoKey:
        if self.type not in REPO_TYPES:
            raise ErrorAnswer(400, f"Unsupported repo type {self.type!r}: expected one of {', '.join(REPO_TYPES)}")
        for part in (self.namespace, self.name):
            if not _NAME_RE.match(part) or ".." in part or part.endswith(".git"):
                raise ErrorAnswer(400, f"Invalid repo id {self.repo_id!r}: use letters, digits, '-', '_' and '.'")
        return self


@dataclass(frozen=True)
class RepoMeta:
    key: RepoKey
    private: bool
    created_at: str


@dataclass(frozen=True)
class FileEntry:
    """One file of a commit. `sha256` addresses its content in the blob store."""

    sha256: str
    size: int
    lfs: bool

    @property
    def pointer(self) -> bytes:
        """The git-LFS pointer git would store in place of the content."""
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()


@dataclass(frozen=True)
class TreeFile:
    """A file as listed in a commit manifest: its entry plus its git blob oid (computed once, at commit)."""

    entry: FileEntry
    oid: str

    @property
    def etag(self) -> str:
        # The Hub's ETag is the git blob sha1 for regular files and the sha256 for LFS files.
        return self.entry.sha256 if self.entry.lfs else self.oid

    def to_json(self) -> dict[str, Any]:
        return {"sha256": self.entry.sha256, "size": self.entry.size, "lfs": self.entry.lfs, "oid": self.oid}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TreeFile:
        return cls(FileEntry(data["sha256"], int(data["size"]), bool(data["lfs"])), data["oid"])


def files_json(files: Mapping[str, TreeFile]) -> dict[str, Any]:
    """A commit's files as stored in its manifest (and hashed into its id), sorted by path."""
    return {path: tree_file.to_json() for path, tree_file in sorted(files.items())}


@dataclass(frozen=True)
class Commit:
    id: str
    parents: tuple[str, ...]
    title: str
    message: str
    author: str
    date: str
    files: dict[str, TreeFile]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parents": list(self.parents),
            "title": self.title,
            "message": self.message,
            "author": self.author,
            "date": self.date,
            "files": files_json(self.files),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Commit:
        files = {path: TreeFile.from_json(info) for path, info in data["files"].items()}
        return cls(
            data["id"], tuple(data["parents"]), data["title"], data["message"], data["author"], data["date"], files
        )


# Commit operations, parsed from the NDJSON body before any lock is taken.
@dataclass(frozen=True)
class AddFile:
    path: str
    tree_file: TreeFile


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class DeleteFolder:
    path: str


Operation = AddFile | DeleteFile | DeleteFolder


# ----------------------------------------------------------------------------------------------------
# Names, paths and hashes


def git_blob_sha1(data: bytes) -> str:
    """The sha1 git gives a blob with this content (what the Hub reports as a file's `oid`)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_sha256(oid: Any) -> bool:
    """Whether `oid` is a lowercase sha256 hex digest (how LFS names its objects)."""
    return isinstance(oid, str) and _SHA256_RE.match(oid) is not None


def validate_repo_path(path: Any) -> str:
    """A file path inside a repo: relative, no empty / "." / ".." segments, nothing under .git/."""
    if not isinstance(path, str) or not path:
        raise ErrorAnswer(400, f"Invalid path in repo: {path!r}")
    parts = path.split("/")
    if path.startswith("/") or any(part in ("", ".", "..") for part in parts) or parts[0] == ".git":
        raise ErrorAnswer(400, f"Invalid path in repo: {path!r}")
    return path
