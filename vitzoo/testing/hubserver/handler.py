"""The Hub API: URL routing, auth, and one handler per endpoint."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, unquote

from vitzoo import refname

from . import lfs
from .documents import commit_json, parse_operations, refs_json, repo_info_json, tree_listing
from .model import (
    DEFAULT_BRANCH,
    SHA1_RE,
    Commit,
    ErrorAnswer,
    RepoKey,
    RepoMeta,
    entry_not_found,
    is_sha256,
    repo_not_found,
)
from .transport import IO_CHUNK, RequestHandler, parse_range


def _unquote_join(segments: list[str]) -> str:
    return "/".join(unquote(segment) for segment in segments)


class HubHandler(RequestHandler):
    # -- routing ------------------------------------------------------------------------------------

    def route(self, method: str, segments: list[str]) -> Callable[[], None]:
        if segments[:1] == ["api"]:
            return self._route_api("GET" if method == "HEAD" else method, segments[1:])
        return self._route_git(method, segments)

    def _no_endpoint(self, method: str) -> ErrorAnswer:
        return ErrorAnswer(404, f"No such endpoint: {method} {self.path}")

    def _route_api(self, method: str, s: list[str]) -> Callable[[], None]:
        fixed: dict[tuple[str, str], Callable[[], None]] = {
            ("GET", "whoami-v2"): self._whoami,
            ("POST", "repos/create"): self._create_repo,
            ("DELETE", "repos/delete"): self._delete_repo,
            ("POST", "validate-yaml"): self._validate_yaml,
        }
        if (method, "/".join(s)) in fixed:
            return fixed[(method, "/".join(s))]
        if len(s) < 3 or s[0] not in ("models", "datasets", "spaces"):
            if s[:1] == ["kernels"]:
                raise ErrorAnswer(400, "Kernel repos are not supported by this server")
            raise self._no_endpoint(method)
        # /api/{type}s/{ns}/{name}[/{action}[/{rest...}]]
        key = RepoKey(s[0][:-1], unquote(s[1]), unquote(s[2]))
        action, args = (s[3], s[4:]) if len(s) > 3 else ("", [])
        rest = _unquote_join(args)
        routes: dict[tuple[str, str], Callable[[], None]] = {
            ("GET", ""): lambda: self._repo_info(key, DEFAULT_BRANCH),
            ("GET", "revision"): lambda: self._repo_info(key, rest),
            ("GET", "tree"): lambda: self._tree(key, unquote(args[0]) if args else "", _unquote_join(args[1:])),
            ("GET", "refs"): lambda: self._refs(key),
            ("GET", "commits"): lambda: self._commits(key, rest or DEFAULT_BRANCH),
            ("POST", "preupload"): lambda: self._preupload(key, rest or DEFAULT_BRANCH),
            ("POST", "commit"): lambda: self._commit(key, rest or DEFAULT_BRANCH),
            ("POST", "branch"): lambda: self._create_branch(key, rest),
            ("POST", "tag"): lambda: self._create_tag(key, rest or DEFAULT_BRANCH),
            ("PUT", "settings"): lambda: self._update_settings(key),
        }
        if action.startswith("xet-"):
            raise ErrorAnswer(501, "Xet storage is not supported by this server: set HF_HUB_DISABLE_XET=1")
        if (method, action) not in routes:
            raise self._no_endpoint(method)
        return routes[(method, action)]

    def _route_git(self, method: str, s: list[str]) -> Callable[[], None]:
        # [{type}s/]{ns}/{name}/resolve/{rev}/{path...} and [{type}s/]{ns}/{name}.git/info/lfs/objects/...
        repo_type = "model"
        if len(s) > 3 and s[0] in ("datasets", "spaces"):
            repo_type, s = s[0][:-1], s[1:]
        if len(s) >= 5 and s[2] == "resolve" and method in ("GET", "HEAD"):
            key = RepoKey(repo_type, unquote(s[0]), unquote(s[1]))
            return lambda: self._resolve(key, unquote(s[3]), _unquote_join(s[4:]))
        if len(s) == 6 and s[1].endswith(".git") and s[2:5] == ["info", "lfs", "objects"]:
            key = RepoKey(repo_type, unquote(s[0]), unquote(s[1])[: -len(".git")])
            if method == "POST" and s[5] == "batch":
                return lambda: self._lfs_batch(key)
            if method == "POST" and s[5] == "verify":
                return lambda: self._lfs_verify(key)
            if method == "PUT":
                return lambda: self._lfs_upload(s[5])
        raise self._no_endpoint(method)

    # -- auth ---------------------------------------------------------------------------------------

    def _has_valid_token(self) -> bool:
        """False without a token; raises 401 on a wrong one (the real Hub refuses bad tokens everywhere)."""
        header = self.headers.get("Authorization")
        if header is None:
            return False
        expected = self.server.token
        scheme, _, given = header.partition(" ")
        if expected is None:
            return True
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
            raise ErrorAnswer(401, "Invalid credentials in Authorization header")
        return True

    def _require_token(self) -> None:
        if not self._has_valid_token() and self.server.token is not None:
            raise ErrorAnswer(401, "This endpoint needs 'Authorization: Bearer <token>'")

    def _existing_repo(self, key: RepoKey) -> RepoMeta:
        meta = self.server.store.load_repo(key.validate())
        if meta is None:
            raise repo_not_found(key.repo_id)
        return meta

    def _readable_repo(self, key: RepoKey) -> RepoMeta:
        authorized = self._has_valid_token() or self.server.token is None
        meta = self._existing_repo(key)
        if meta.private and not authorized:
            raise repo_not_found(key.repo_id, status=401)  # the Hub's answer for anonymous private access
        return meta

    def _writable_repo(self, key: RepoKey) -> RepoMeta:
        self._require_token()
        return self._existing_repo(key)

    # -- account and repos --------------------------------------------------------------------------

    def _whoami(self) -> None:
        self._require_token()
        name = self.server.store.username
        self._send_json(
            {
                "type": "user",
                "name": name,
                "fullname": name,
                "orgs": [],
                "auth": {"type": "access_token", "accessToken": {"displayName": "hubserver", "role": "write"}},
            }
        )

    def _repo_key_from_body(self, body: Mapping[str, Any]) -> RepoKey:
        repo_type = body.get("type") or "model"
        namespace = body.get("organization") or self.server.store.username
        return RepoKey(repo_type, namespace, str(body.get("name") or "")).validate()

    def _create_repo(self) -> None:
        self._require_token()
        body = self._read_json()
        key = self._repo_key_from_body(body)
        private = bool(body.get("private")) or body.get("visibility") == "private"
        url = f"{self._base_url()}/{key.url_path}"
        if not self.server.store.create_repo(key, private):
            # create_repo(exist_ok=True) still reads "url" from the 409 answer.
            self._send_json({"error": f"You already created this {key.type} repo", "url": url}, 409)
            return
        self._send_json({"url": url, "name": key.repo_id, "id": key.repo_id})

    def _delete_repo(self) -> None:
        self._require_token()
        key = self._repo_key_from_body(self._read_json())
        if not self.server.store.delete_repo(key):
            raise repo_not_found(key.repo_id)
        self._send_json({})

    def _update_settings(self, key: RepoKey) -> None:
        """PUT /api/{type}s/{repo}/settings (update_repo_settings): `visibility` ("public", "private"; the
        older clients' `private` bool too). Gating is not modelled here: refused, not ignored."""
        self._writable_repo(key)
        body = self._read_json()
        if body.get("gated") not in (None, False):
            raise ErrorAnswer(501, "Gated repos are not supported by this server")
        visibility = body.get("visibility")
        if visibility is None and isinstance(body.get("private"), bool):
            visibility = "private" if body["private"] else "public"
        if visibility not in (None, "public", "private"):
            raise ErrorAnswer(400, f"Invalid visibility {visibility!r} for a {key.type} repo: public or private")
        if visibility is not None:
            self.server.store.set_private(key, visibility == "private")
        self._send_json({})

    def _validate_yaml(self) -> None:
        # No YAML parser in the standard library: accept any model card metadata.
        self._read_json()
        self._send_json({"errors": [], "warnings": []})

    # -- reads --------------------------------------------------------------------------------------

    def _resolved_commit(self, key: RepoKey, revision: str) -> tuple[RepoMeta, Commit]:
        meta = self._readable_repo(key)
        store = self.server.store
        return meta, store.load_commit(key, store.resolve(key, revision))

    def _repo_info(self, key: RepoKey, revision: str) -> None:
        meta, commit = self._resolved_commit(key, revision)
        self._send_json(repo_info_json(meta, commit))

    def _tree(self, key: RepoKey, revision: str, folder: str) -> None:
        _, commit = self._resolved_commit(key, revision)
        self._send_json(tree_listing(commit.files, folder.strip("/"), self._query_flag("recursive"), commit.id))

    def _refs(self, key: RepoKey) -> None:
        self._readable_repo(key)
        self._send_json(refs_json(self.server.store.refs(key)))

    def _commits(self, key: RepoKey, revision: str) -> None:
        _, commit = self._resolved_commit(key, revision)
        self._send_json([commit_json(c) for c in self.server.store.history(key, commit.id)])

    def _resolve(self, key: RepoKey, revision: str, path: str) -> None:
        _, commit = self._resolved_commit(key, revision)
        tree_file = commit.files.get(path)
        if tree_file is None:
            raise entry_not_found(path, commit.id)
        entry = tree_file.entry
        byte_range = parse_range(self.headers.get("Range"), entry.size)
        start, end = byte_range if byte_range else (0, entry.size - 1)
        filename = quote(path.rsplit("/", 1)[-1])
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Length": str(end - start + 1),
            "Accept-Ranges": "bytes",
            "ETag": f'"{tree_file.etag}"',
            "X-Repo-Commit": commit.id,
            "Content-Disposition": f"inline; filename*=UTF-8''{filename}; filename=\"{filename}\";",
        }
        if entry.lfs:
            # The client prefers these to ETag/Content-Length (on the real Hub they describe a redirect's target).
            headers.update({"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)})
        if byte_range:
            headers["Content-Range"] = f"bytes {start}-{end}/{entry.size}"
        self._send_head(206 if byte_range else 200, headers)
        if self.command == "GET":
            self._copy_blob(entry.sha256, start, end - start + 1)

    def _copy_blob(self, sha256: str, offset: int, length: int) -> None:
        with open(self.server.store.blob_path(sha256), "rb") as f:
            f.seek(offset)
            while length > 0:
                chunk = f.read(min(IO_CHUNK, length))
                if not chunk:
                    raise OSError(f"Blob {sha256} is shorter than its manifest says")
                self.wfile.write(chunk)
                length -= len(chunk)

    # -- writes -------------------------------------------------------------------------------------

    def _preupload(self, key: RepoKey, revision: str) -> None:
        self._writable_repo(key)
        body = self._read_json()
        store = self.server.store
        commit = store.load_commit(key, store.resolve(key, revision))
        self._send_json({"files": lfs.upload_modes(store, commit, body.get("files", [])), "commitOid": commit.id})

    def _commit(self, key: RepoKey, revision: str) -> None:
        self._writable_repo(key)
        store = self.server.store
        header, operations = parse_operations(store, self._read_body().splitlines())
        commit, pr_number = store.commit(
            key,
            revision,
            operations,
            title=str(header.get("summary") or "Upload files"),
            message=str(header.get("description") or ""),
            parent_commit=header.get("parentCommit"),
            create_pr=self._query_flag("create_pr"),
        )
        repo_url = f"{self._base_url()}/{key.url_path}"
        self._send_json(
            {
                "success": True,
                "commitOid": commit.id,
                "commitUrl": f"{repo_url}/commit/{commit.id}",
                "pullRequestUrl": f"{repo_url}/discussions/{pr_number}" if pr_number is not None else None,
            }
        )

    def _create_branch(self, key: RepoKey, branch: str) -> None:
        self._writable_repo(key)
        body = self._read_json()
        if not branch or branch.startswith("refs/") or SHA1_RE.match(branch) or refname.problem(branch):
            raise ErrorAnswer(400, f"Invalid branch name {branch!r}: {refname.problem(branch) or 'a ref or commit id'}")
        self.server.store.create_ref(key, f"refs/heads/{branch}", body.get("startingPoint"))
        self._send_json({})

    def _create_tag(self, key: RepoKey, revision: str) -> None:
        self._writable_repo(key)
        tag = self._read_json().get("tag")
        if not isinstance(tag, str) or tag.startswith("refs/") or refname.problem(tag):
            raise ErrorAnswer(400, f"Invalid tag name {tag!r}: {refname.problem(tag) or 'a ref'}")
        self.server.store.create_ref(key, f"refs/tags/{tag}", revision)
        self._send_json({})

    # -- git LFS ------------------------------------------------------------------------------------

    def _lfs_batch(self, key: RepoKey) -> None:
        self._writable_repo(key)
        body = self._read_json()
        if body.get("operation") != "upload":
            raise ErrorAnswer(400, "Only the LFS 'upload' operation is supported; download through /resolve")
        objects_url = f"{self._base_url()}/{key.url_path}.git/info/lfs/objects"
        store, secret = self.server.store, self.server.upload_secret
        objects = [lfs.batch_object(store, item, objects_url, secret) for item in body.get("objects", [])]
        self._send_json(
            {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
            content_type="application/vnd.git-lfs+json",
        )

    def _lfs_upload(self, oid: str) -> None:
        size = lfs.signed_upload_size(oid, self._query, self.server.upload_secret)
        self.server.store.put_stream(self._iter_body(), oid, size)
        self._send_json({}, headers={"ETag": f'"{oid}"'})

    def _lfs_verify(self, key: RepoKey) -> None:
        self._writable_repo(key)
        body = self._read_json()
        oid, size = body.get("oid"), body.get("size")
        if not is_sha256(oid) or not self.server.store.has_blob(oid, size):
            raise ErrorAnswer(404, f"LFS object {oid} of {size} bytes is not stored")
        self._send_json({"oid": oid, "size": size})
