"""A Hugging Face Hub-compatible HTTP server on 127.0.0.1, for tests and work without the network.

It answers what huggingface_hub's client sends to push and pull a model repo (the protocol:
/work/shared/reference/hub-protocol.md): repo create, info and settings, preupload (every file is
uploaded inline, "regular"), NDJSON commits, tree listing, commits, branches, tags, and resolve
downloads. A binary file is served as the Hub serves an LFS file, named by its sha256.
Repos live on disk under the root (one JSON per repo, blobs by sha256) and outlive the server.
With a token, writes and private repos need it, and any other token is refused (401) everywhere.
No Xet storage: clients set HF_HUB_DISABLE_XET=1.

    python -m tests.hubserver --root DIR --port 0 --token T [--user U]   # first line: the URL
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

SHA1 = re.compile(r"^[0-9a-f]{40}$")
NAME = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}$")
GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"


class Answer(Exception):
    """An error answered to the client: status, message, the Hub's X-Error-Code, extra headers."""

    def __init__(self, status: int, message: str, code: str | None = None, **headers: str) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, {**headers}
        if code:
            self.headers["X-Error-Code"] = code


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def is_binary(data: bytes) -> bool:
    """Whether the Hub would keep the file in LFS: not UTF-8 text."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return b"\0" in data


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Store:
    """Repos on disk: repos/NS/NAME.json (private, created, refs, commits); blobs/SHA256."""

    def __init__(self, root: str | os.PathLike, username: str) -> None:
        self.root, self.username, self.lock = Path(root), username, threading.RLock()
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)

    def _path(self, repo_id: str) -> Path:
        return self.root / "repos" / f"{repo_id}.json"

    def load(self, repo_id: str) -> dict | None:
        try:
            return json.loads(self._path(repo_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def save(self, repo_id: str, repo: dict) -> None:
        path = self._path(repo_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{threading.get_ident()}")
        tmp.write_text(json.dumps(repo), encoding="utf-8")
        os.replace(tmp, path)

    def put(self, data: bytes) -> dict:
        sha256 = hashlib.sha256(data).hexdigest()
        blob = self.root / "blobs" / sha256
        if not blob.exists():
            tmp = blob.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_bytes(data)
            os.replace(tmp, blob)
        return {"sha256": sha256, "size": len(data), "oid": git_blob_sha1(data),
                "lfs": is_binary(data)}

    def blob(self, sha256: str) -> bytes:
        return (self.root / "blobs" / sha256).read_bytes()

    def commit(self, repo: dict, ref: str, files: dict, title: str) -> str:
        parent = repo["refs"].get(ref)
        date = _now()
        sha = hashlib.sha1(json.dumps([parent, title, date, files]).encode()).hexdigest()
        repo["commits"][sha] = {"parent": parent, "title": title, "date": date, "files": files}
        repo["refs"][ref] = sha
        return sha

    @staticmethod
    def resolve(repo: dict, revision: str) -> str:
        for ref in (revision, f"refs/heads/{revision}", f"refs/tags/{revision}"):
            if ref in repo["refs"]:
                return repo["refs"][ref]
        if revision in repo["commits"]:
            return revision
        raise Answer(404, f"Invalid rev id: {revision}", "RevisionNotFound")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client pools its connections
    server: _HTTPServer

    def log_message(self, *args) -> None:
        pass

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        self.body_read = "Content-Length" not in self.headers
        try:
            self.route([unquote(s) for s in url.path.split("/")[1:]])
        except Answer as answer:
            headers = {"X-Error-Message": answer.message, **answer.headers}
            self.send(answer.status, {"error": answer.message}, headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        if not self.body_read:
            self.close_connection = True  # unread body bytes would be taken for the next request

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _dispatch

    def body(self) -> bytes:
        self.body_read = True
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def json_body(self) -> dict:
        try:
            return json.loads(self.body() or b"{}")
        except ValueError:
            raise Answer(400, "Malformed JSON body") from None

    def send(self, status: int, payload, headers: dict | None = None, raw: bytes | None = None):
        data = raw if raw is not None else json.dumps(payload).encode()
        self.send_response(status)
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data)),
                   **(headers or {})}
        for name, value in headers.items():
            self.send_header(name, value.encode("ascii", "replace").decode().replace("\n", " "))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    # -- auth and repos
    def authorized(self) -> bool:
        """Whether a valid token came; a wrong one is refused, as the Hub refuses it."""
        given = self.headers.get("Authorization", "")
        if self.server.token is None or not given:
            return self.server.token is None
        expected = self.server.token.encode()
        if not hmac.compare_digest(given.removeprefix("Bearer ").encode(), expected):
            raise Answer(401, "Invalid credentials in Authorization header")
        return True

    def repo(self, repo_id: str, write: bool = False) -> dict:
        allowed = self.authorized()
        if write and not allowed:
            raise Answer(401, "This endpoint needs 'Authorization: Bearer <token>'")
        repo = self.server.store.load(repo_id)
        if repo is None or (repo["private"] and not allowed):
            status = 404 if repo is None else 401  # the Hub's answers
            raise Answer(status, f"Repository not found: {repo_id}", "RepoNotFound")
        return repo

    def route(self, s: list[str]) -> None:
        method = "GET" if self.command == "HEAD" else self.command
        if method == "POST" and s == ["api", "repos", "create"]:
            return self.create_repo()
        if method == "POST" and s == ["api", "validate-yaml"]:
            return self.send(200, {"errors": [], "warnings": []})
        if s[:2] == ["api", "models"] and len(s) >= 4:
            repo_id, action, rest = f"{s[2]}/{s[3]}", (s[4:5] or [""])[0], "/".join(s[5:])
            actions = {("GET", ""): lambda: self.info(repo_id, "main"),
                       ("GET", "revision"): lambda: self.info(repo_id, rest),
                       ("GET", "tree"): lambda: self.tree(repo_id, (s[5:6] or ["main"])[0],
                                                          "/".join(s[6:])),
                       ("GET", "commits"): lambda: self.commits(repo_id, rest or "main"),
                       ("POST", "preupload"): lambda: self.preupload(repo_id),
                       ("POST", "commit"): lambda: self.commit(repo_id, rest or "main"),
                       ("POST", "branch"): lambda: self.create_ref(repo_id, "branch", rest),
                       ("POST", "tag"): lambda: self.create_ref(repo_id, "tag", rest or "main"),
                       ("PUT", "settings"): lambda: self.settings(repo_id)}
            if (method, action) in actions:
                return actions[(method, action)]()
        if len(s) >= 5 and s[2] == "resolve" and method == "GET":
            return self.resolve(f"{s[0]}/{s[1]}", s[3], "/".join(s[4:]))
        raise Answer(404, f"No such endpoint: {self.command} {self.path}")

    def create_repo(self) -> None:
        if not self.authorized():
            raise Answer(401, "This endpoint needs 'Authorization: Bearer <token>'")
        body = self.json_body()
        namespace = body.get("organization") or self.server.store.username
        name = str(body.get("name") or "")
        if not (NAME.match(namespace) and NAME.match(name)) or ".." in name:
            raise Answer(400, f"Invalid repo id {namespace}/{name!r}")
        repo_id, store = f"{namespace}/{name}", self.server.store
        url = f"http://{self.headers['Host']}/{repo_id}"
        with store.lock:
            if store.load(repo_id) is not None:  # create_repo(exist_ok=True) reads "url" here
                return self.send(409, {"error": "You already created this model repo", "url": url})
            private = bool(body.get("private")) or body.get("visibility") == "private"
            repo = {"private": private, "created": _now(), "refs": {}, "commits": {}}
            files = {".gitattributes": store.put(GITATTRIBUTES)}
            store.commit(repo, "refs/heads/main", files, "initial commit")
            store.save(repo_id, repo)
        self.send(200, {"url": url, "name": repo_id, "id": repo_id})

    def settings(self, repo_id: str) -> None:
        store = self.server.store
        with store.lock:
            repo, body = self.repo(repo_id, write=True), self.json_body()
            if body.get("gated") not in (None, False):
                raise Answer(501, "Gated repos are not supported by this server")
            visibility = body.get("visibility")
            if isinstance(body.get("private"), bool):
                visibility = "private" if body["private"] else "public"
            if visibility not in (None, "public", "private"):
                raise Answer(400, f"Invalid visibility {visibility!r}")
            if visibility:
                repo["private"] = visibility == "private"
                store.save(repo_id, repo)
        self.send(200, {})

    # -- reads
    def info(self, repo_id: str, revision: str) -> None:
        repo = self.repo(repo_id)
        sha = self.server.store.resolve(repo, revision)
        files = repo["commits"][sha]["files"]
        siblings = [{"rfilename": path, "size": f["size"]} for path, f in sorted(files.items())]
        self.send(200, {"id": repo_id, "author": repo_id.split("/")[0], "sha": sha,
                        "private": repo["private"], "gated": False, "disabled": False,
                        "createdAt": repo["created"], "lastModified": repo["commits"][sha]["date"],
                        "downloads": 0, "likes": 0, "tags": [], "siblings": siblings})

    def tree(self, repo_id: str, revision: str, folder: str) -> None:
        repo = self.repo(repo_id)
        sha = self.server.store.resolve(repo, revision)
        base = f"{folder}/" if folder else ""
        recursive = self.query.get("recursive", [""])[0].lower() == "true"
        items, folders = [], set()
        for path, f in sorted(repo["commits"][sha]["files"].items()):
            if not path.startswith(base):
                continue
            parts = path[len(base):].split("/")
            depth = len(parts) - 1 if recursive else min(1, len(parts) - 1)
            folders.update(base + "/".join(parts[:i + 1]) for i in range(depth))
            if recursive or len(parts) == 1:
                items.append({"type": "file", "oid": f["oid"], "size": f["size"], "path": path,
                              **({"lfs": {"oid": f["sha256"], "size": f["size"],
                                          "pointerSize": 134}} if f["lfs"] else {})})
        if folder and not items and not folders:
            raise Answer(404, f"Entry not found: {folder}", "EntryNotFound")
        items += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": p} for p in folders]
        self.send(200, sorted(items, key=lambda item: item["path"]))

    def commits(self, repo_id: str, revision: str) -> None:
        repo, out = self.repo(repo_id), []
        sha = self.server.store.resolve(repo, revision)
        while sha:
            commit = repo["commits"][sha]
            out.append({"id": sha, "title": commit["title"], "message": "", "date": commit["date"],
                        "authors": [{"user": self.server.store.username}]})
            sha = commit["parent"]
        self.send(200, out)

    def resolve(self, repo_id: str, revision: str, path: str) -> None:
        repo = self.repo(repo_id)
        sha = self.server.store.resolve(repo, revision)
        f = repo["commits"][sha]["files"].get(path)
        if f is None:
            raise Answer(404, f"Entry not found: {path}", "EntryNotFound", **{"X-Repo-Commit": sha})
        data = self.server.store.blob(f["sha256"]) if self.command == "GET" else b""
        start, end = 0, f["size"] - 1
        asked = re.match(r"^bytes=(\d+)-(\d*)$", self.headers.get("Range", ""))
        if asked:
            start, end = int(asked[1]), min(int(asked[2] or end), end)
        headers = {"Content-Type": "application/octet-stream",
                   "Content-Length": str(end - start + 1), "X-Repo-Commit": sha,
                   "ETag": f'"{f["sha256"] if f["lfs"] else f["oid"]}"'}
        if f["lfs"]:
            headers.update({"X-Linked-Etag": f'"{f["sha256"]}"', "X-Linked-Size": str(f["size"])})
        if asked:
            headers["Content-Range"] = f"bytes {start}-{end}/{f['size']}"
        self.send(206 if asked else 200, None, headers, raw=data[start:end + 1])

    # -- writes
    def preupload(self, repo_id: str) -> None:
        self.repo(repo_id, write=True)
        files = self.json_body().get("files", [])
        modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
        self.send(200, {"files": modes})

    def commit(self, repo_id: str, revision: str) -> None:
        store = self.server.store
        self.repo(repo_id, write=True)
        lines = [json.loads(line) for line in self.body().splitlines() if line.strip()]
        with store.lock:
            repo = self.repo(repo_id, write=True)
            ref = revision if revision.startswith("refs/") else f"refs/heads/{revision}"
            if ref not in repo["refs"]:
                raise Answer(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            files, title = dict(repo["commits"][repo["refs"][ref]]["files"]), "Upload files"
            for line in lines:
                key, value = line["key"], line["value"]
                path = value.get("path", "")
                if key == "header":
                    title = value.get("summary") or title
                elif key == "file":
                    files[path] = store.put(base64.b64decode(value["content"]))
                elif key == "deletedFile" and files.pop(path, None) is None:
                    raise Answer(404, f"A file with this name doesn't exist: {path}",
                                 "EntryNotFound")
                elif key == "deletedFolder":
                    for doomed in [p for p in files if p.startswith(path.rstrip("/") + "/")]:
                        del files[doomed]
                elif key not in ("header", "file", "deletedFile"):
                    raise Answer(400, f"Unsupported commit operation {key!r} (uploads are inline)")
            sha = store.commit(repo, ref, files, title)
            store.save(repo_id, repo)
        url = f"http://{self.headers['Host']}/{repo_id}"
        self.send(200, {"success": True, "commitOid": sha, "commitUrl": f"{url}/commit/{sha}",
                        "pullRequestUrl": None})

    def create_ref(self, repo_id: str, kind: str, name: str) -> None:
        """A branch `name` (at its startingPoint, default main), or a tag at the revision `name`."""
        store = self.server.store
        with store.lock:
            repo, body = self.repo(repo_id, write=True), self.json_body()
            if kind == "branch":
                ref, start = f"refs/heads/{name}", body.get("startingPoint") or "main"
            else:
                ref, start = f"refs/tags/{body.get('tag')}", name
            if ref in repo["refs"]:
                raise Answer(409, f"Reference already exists: {ref}")
            repo["refs"][ref] = store.resolve(repo, start)
            store.save(repo_id, repo)
        self.send(200, {})


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a keep-alive connection must not hold up shutdown


class HubServer:
    """The server over the directory `root`, from a background thread; `url` once started.

    >>> with HubServer(tmp_path / "hub", token="secret") as hub:   # doctest: +SKIP
    ...     HfApi(endpoint=hub.url, token="secret").create_repo("alice/vit")
    """

    def __init__(self, root: str | os.PathLike, *, token: str | None = None, port: int = 0,
                 username: str = "user") -> None:
        self.store, self.token, self.port, self._httpd = Store(root, username), token, port, None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubServer:
        self._httpd = _HTTPServer(("127.0.0.1", self.port), Handler)
        self._httpd.store, self._httpd.token = self.store, self.token
        serve = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05})
        serve.daemon = True
        serve.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
