"""Repositories on disk: content-addressed blobs, immutable commit manifests, refs; atomic writes, locking."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .model import (
    DEFAULT_BRANCH,
    SHA1_RE,
    AddFile,
    Commit,
    DeleteFile,
    ErrorAnswer,
    FileEntry,
    Operation,
    RepoKey,
    RepoMeta,
    TreeFile,
    entry_not_found,
    files_json,
    git_blob_sha1,
    repo_not_found,
    revision_not_found,
)

# Patterns the Hub puts in a new repo's .gitattributes: weights and archives go to LFS by name.
_INITIAL_LFS_PATTERNS = """
    *.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack *.npy *.npz
    *.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors saved_model/**/* *.tar.* *.tar
    *.tflite *.tgz *.wasm *.xz *.zip *.zst *tfevents*
""".split()
INITIAL_GITATTRIBUTES = "".join(f"{pattern} filter=lfs diff=lfs merge=lfs -text\n" for pattern in _INITIAL_LFS_PATTERNS)


def _now() -> str:
    # The client's parse_datetime expects ISO 8601 in UTC with a "Z" suffix.
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _write_json_atomic(path: Path, data: Any) -> None:
    """Replace `path` in one step, so a reader or a crash never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class HubStore:
    """Repositories on disk. Thread-safe; every state change is an atomic file replacement.

    Layout under `root`::

        blobs/<sha256[:2]>/<sha256>               file contents, stored once
        repos/<type>/<ns>/<name>/repo.json        visibility, creation date (written last: marks a whole repo)
        repos/<type>/<ns>/<name>/refs.json        {"refs/heads/main": sha, "refs/tags/v1": sha, "refs/pr/1": sha}
        repos/<type>/<ns>/<name>/commits/<sha>.json   immutable manifest of one commit
        tmp/                                      uploads in progress (one server per root: emptied at start)
    """

    def __init__(self, root: str | os.PathLike[str], username: str = "user") -> None:
        self.root = Path(root)
        self.username = username
        self._lock = threading.RLock()
        self._tmp = self.root / "tmp"
        self._tmp.mkdir(parents=True, exist_ok=True)
        for orphan in self._tmp.iterdir():  # left by an upload that a killed server never finished
            with contextlib.suppress(OSError):
                orphan.unlink()

    # -- blobs --------------------------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256[:2] / sha256

    def has_blob(self, sha256: str, size: int | None = None) -> bool:
        path = self.blob_path(sha256)
        return path.is_file() and (size is None or path.stat().st_size == size)

    def put_bytes(self, data: bytes) -> FileEntry:
        digest = hashlib.sha256(data).hexdigest()
        if not self.has_blob(digest, len(data)):
            self._store(digest, [data])
        return FileEntry(digest, len(data), lfs=False)

    def put_stream(self, chunks: Iterable[bytes], sha256: str, size: int) -> None:
        """Store an uploaded LFS object, refusing it unless its bytes hash to `sha256`."""
        self._store(sha256, chunks, expected_size=size, verify=True)

    def _store(
        self, sha256: str, chunks: Iterable[bytes], expected_size: int | None = None, verify: bool = False
    ) -> None:
        fd, tmp = tempfile.mkstemp(dir=self._tmp, prefix="blob-")
        try:
            digest, written = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    written += len(chunk)
                    if expected_size is not None and written > expected_size:
                        raise ErrorAnswer(400, f"Upload is larger than the declared {expected_size} bytes")
                    digest.update(chunk)
                    f.write(chunk)
            if expected_size is not None and written != expected_size:
                raise ErrorAnswer(400, f"Upload has {written} bytes, {expected_size} were declared")
            if verify and digest.hexdigest() != sha256:
                raise ErrorAnswer(
                    400, f"sha256 mismatch: expected {sha256}, the uploaded bytes hash to {digest.hexdigest()}"
                )
            self.blob_path(sha256).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, self.blob_path(sha256))  # content-addressed: a concurrent equal write is harmless
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    def read_blob(self, sha256: str) -> bytes:
        return self.blob_path(sha256).read_bytes()

    # -- repos --------------------------------------------------------------------------------------

    def _repo_dir(self, key: RepoKey) -> Path:
        return self.root / "repos" / key.type / key.namespace / key.name

    def load_repo(self, key: RepoKey) -> RepoMeta | None:
        try:
            data = json.loads((self._repo_dir(key) / "repo.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        return RepoMeta(key, bool(data["private"]), data["createdAt"])

    def create_repo(self, key: RepoKey, private: bool) -> bool:
        """Create the repo with an initial commit; False if it already existed."""
        with self._lock:
            if self.load_repo(key) is not None:
                return False
            repo_dir = self._repo_dir(key)
            if repo_dir.exists():  # leftovers of an interrupted create
                shutil.rmtree(repo_dir)
            attributes = INITIAL_GITATTRIBUTES.encode()
            files = {".gitattributes": TreeFile(self.put_bytes(attributes), git_blob_sha1(attributes))}
            initial = self._write_commit(key, (), "initial commit", "", files)
            _write_json_atomic(repo_dir / "refs.json", {f"refs/heads/{DEFAULT_BRANCH}": initial.id})
            _write_json_atomic(repo_dir / "repo.json", {"private": private, "createdAt": _now()})
            return True

    def set_private(self, key: RepoKey, private: bool) -> None:
        with self._lock:
            meta = self.load_repo(key)
            if meta is None:
                raise repo_not_found(key.repo_id)
            _write_json_atomic(self._repo_dir(key) / "repo.json", {"private": private, "createdAt": meta.created_at})

    def delete_repo(self, key: RepoKey) -> bool:
        with self._lock:
            repo_dir = self._repo_dir(key)
            if self.load_repo(key) is None:
                return False
            # Rename first, so the repo disappears at once even if the removal is slow.
            doomed = Path(tempfile.mkdtemp(dir=self._tmp, prefix="deleted-"))
            os.replace(repo_dir, doomed / "repo")
        shutil.rmtree(doomed, ignore_errors=True)
        return True

    # -- refs and commits ---------------------------------------------------------------------------

    def refs(self, key: RepoKey) -> dict[str, str]:
        return json.loads((self._repo_dir(key) / "refs.json").read_text(encoding="utf-8"))

    def _write_refs(self, key: RepoKey, refs: Mapping[str, str]) -> None:
        _write_json_atomic(self._repo_dir(key) / "refs.json", dict(refs))

    def resolve(self, key: RepoKey, revision: str) -> str:
        """The commit sha a revision names: a branch, tag, `refs/...` name or full commit sha."""
        refs = self.refs(key)
        candidates = [revision] if revision.startswith("refs/") else [f"refs/heads/{revision}", f"refs/tags/{revision}"]
        for ref in candidates:
            if ref in refs:
                return refs[ref]
        if SHA1_RE.match(revision) and (self._repo_dir(key) / "commits" / f"{revision}.json").is_file():
            return revision
        raise revision_not_found(revision)

    def load_commit(self, key: RepoKey, commit_id: str) -> Commit:
        path = self._repo_dir(key) / "commits" / f"{commit_id}.json"
        return Commit.from_json(json.loads(path.read_text(encoding="utf-8")))

    def _write_commit(
        self, key: RepoKey, parents: tuple[str, ...], title: str, message: str, files: dict[str, TreeFile]
    ) -> Commit:
        date = _now()
        # Like git, the id hashes the content, the parents, the message and the date.
        identity = {
            "parents": list(parents),
            "title": title,
            "message": message,
            "author": self.username,
            "date": date,
            "files": files_json(files),
        }
        commit_id = hashlib.sha1(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        commit = Commit(commit_id, parents, title, message, self.username, date, files)
        _write_json_atomic(self._repo_dir(key) / "commits" / f"{commit_id}.json", commit.to_json())
        return commit

    def commit(
        self,
        key: RepoKey,
        revision: str,
        operations: list[Operation],
        *,
        title: str,
        message: str = "",
        parent_commit: str | None = None,
        create_pr: bool = False,
    ) -> tuple[Commit, int | None]:
        """Apply `operations` on top of `revision`; returns the new commit and the PR number if one was opened."""
        with self._lock:  # read-modify-write of refs.json
            refs = self.refs(key)
            target_ref, base_id = self._commit_target(key, refs, revision, create_pr)
            if parent_commit is not None and parent_commit != base_id:
                raise ErrorAnswer(412, f"Parent commit {parent_commit} is not the head of {revision} ({base_id})")
            files = _apply_operations(self.load_commit(key, base_id).files, operations, base_id)
            commit = self._write_commit(key, (base_id,), title, message, files)
            refs[target_ref] = commit.id
            self._write_refs(key, refs)
        pr_number = int(target_ref.rsplit("/", 1)[1]) if target_ref.startswith("refs/pr/") else None
        return commit, pr_number

    def _commit_target(self, key: RepoKey, refs: Mapping[str, str], revision: str, create_pr: bool) -> tuple[str, str]:
        """The ref a commit moves and the commit it starts from."""
        if create_pr:
            base_id = self.resolve(key, revision)
            numbers = [int(ref.rsplit("/", 1)[1]) for ref in refs if re.fullmatch(r"refs/pr/\d+", ref)]
            return f"refs/pr/{max(numbers, default=0) + 1}", base_id
        if revision.startswith(("refs/heads/", "refs/pr/")):
            ref = revision
        elif revision.startswith("refs/") or f"refs/tags/{revision}" in refs or SHA1_RE.match(revision):
            raise ErrorAnswer(400, f"Cannot commit to {revision!r}: commits go to a branch or a pull request ref")
        else:
            ref = f"refs/heads/{revision}"
        if ref not in refs:
            raise revision_not_found(revision)
        return ref, refs[ref]

    def create_ref(self, key: RepoKey, ref: str, revision: str | None) -> str:
        """Create a branch or tag at `revision` (default: main); 409 if it exists."""
        with self._lock:
            refs = self.refs(key)
            if ref in refs:
                raise ErrorAnswer(409, f"Reference already exists: {ref}")
            refs[ref] = self.resolve(key, revision or DEFAULT_BRANCH)
            self._write_refs(key, refs)
            return refs[ref]

    def history(self, key: RepoKey, commit_id: str) -> Iterator[Commit]:
        """The commit and its first-parent ancestors, newest first."""
        while True:
            commit = self.load_commit(key, commit_id)
            yield commit
            if not commit.parents:
                return
            commit_id = commit.parents[0]


def _apply_operations(files: Mapping[str, TreeFile], operations: list[Operation], base_id: str) -> dict[str, TreeFile]:
    # A missing file or folder is answered with these sentences: the client looks for them to hint at
    # file-vs-folder deletes.
    result = dict(files)
    for operation in operations:
        if isinstance(operation, AddFile):
            result[operation.path] = operation.tree_file
        elif isinstance(operation, DeleteFile):
            if result.pop(operation.path, None) is None:
                message = f"A file with this name doesn't exist: {operation.path}"
                raise entry_not_found(operation.path, base_id, message)
        else:
            prefix = operation.path.rstrip("/") + "/"
            doomed = [path for path in result if path.startswith(prefix)]
            if not doomed:
                message = f"A folder with this name doesn't exist: {operation.path}"
                raise entry_not_found(operation.path, base_id, message)
            for path in doomed:
                del result[path]
    return result
