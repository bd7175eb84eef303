"""A Hugging Face Hub-compatible HTTP server on 127.0.0.1, test equipment: what huggingface_hub
sends to push and pull model repos (commits with every file inline, branches, a token, private
repos, downloads with the Hub's headers, a binary file redirected to its blob as the Hub redirects
an LFS file). No Xet storage: clients set HF_HUB_DISABLE_XET=1.

    python -m tests.hubserver --root DIR --port 0 --token T [--user U]   # first line: the URL
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"


class Answer(Exception):
    """An error answered to the client: (status, message, the Hub's X-Error-Code or "")."""


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the client pools its connections
    server: HubServer

    def log_message(self, *args) -> None:
        pass

    def send(self, status: int, payload=None, data: bytes | None = None, **headers: str) -> None:
        data = json.dumps(payload).encode() if data is None else data
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                            **{k.replace("_", "-"): v for k, v in headers.items()}}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def answer(self) -> None:
        url, length = urlsplit(self.path), int(self.headers.get("Content-Length") or 0)
        self.body, self.query = self.rfile.read(length), parse_qs(url.query)
        method = "GET" if self.command == "HEAD" else self.command
        try:
            for verb, pattern, action in ROUTES:
                if verb == method and (match := re.fullmatch(pattern, url.path)):
                    with self.server.lock:
                        return action(self, **{k: unquote(v or "")
                                               for k, v in match.groupdict().items()})
            raise Answer(404, f"no such endpoint: {self.command} {url.path}", "")
        except Answer as answer:
            status, message, code = answer.args
            self.send(status, {"error": message}, X_Error_Message=message,
                      **({"X_Error_Code": code} if code else {}))

    do_GET = do_HEAD = do_POST = do_PUT = answer

    def authorize(self, write: bool) -> bool:
        """Whether the token came; any other token is refused, as the Hub refuses it."""
        token, given = self.server.token, self.headers.get("Authorization", "")
        given = given.removeprefix("Bearer ")
        if token and given and given != token:
            raise Answer(401, "Invalid credentials in Authorization header", "")
        if token and write and not given:
            raise Answer(401, "this needs 'Authorization: Bearer TOKEN'", "")
        return not token or bool(given)

    def repo(self, repo: str, write: bool = False) -> dict:
        allowed, found = self.authorize(write), self.server.repos.get(repo)
        if found is None or (found["private"] and not allowed):
            raise Answer(401 if found else 404, f"Repository not found: {repo}", "RepoNotFound")
        return found

    def commit_of(self, repo: str, rev: str) -> tuple[str, dict]:
        found = self.repo(repo)
        if (sha := found["refs"].get(rev, rev)) not in found["commits"]:
            raise Answer(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return sha, found["commits"][sha]["files"]

    def info(self, repo: str, rev: str) -> None:
        sha, files = self.commit_of(repo, rev or "main")
        self.send(200, {"id": repo, "sha": sha, "private": self.repo(repo)["private"],
                        "siblings": [{"rfilename": path} for path in sorted(files)]})

    def tree(self, repo: str, rev: str, path: str) -> None:
        self.send(200, [{"type": "file", "path": name, "oid": f["oid"], "size": f["size"],
                         **({"lfs": {"oid": f["sha256"], "size": f["size"], "pointerSize": 134}}
                            if f["lfs"] else {})}
                        for name, f in sorted(self.commit_of(repo, rev)[1].items())
                        if name.startswith(path)])

    def resolve(self, repo: str, rev: str, path: str) -> None:
        sha, files = self.commit_of(repo, rev)
        if path not in files:
            raise Answer(404, f"Entry not found: {path}", "EntryNotFound")
        if (f := files[path])["lfs"]:  # to its blob, as the Hub sends an LFS file to its storage
            return self.send(302, {}, Location=f"/blobs/{f['sha256']}?commit={sha}",
                             X_Repo_Commit=sha, X_Linked_Etag=f'"{f["sha256"]}"',
                             X_Linked_Size=str(f["size"]))
        self.send(200, data=self.server.blob(f["sha256"]), ETag=f'"{f["oid"]}"', X_Repo_Commit=sha)

    def download_blob(self, sha256: str) -> None:
        self.send(200, data=self.server.blob(sha256), ETag=f'"{sha256}"',
                  X_Repo_Commit=self.query["commit"][0])

    def create(self) -> None:
        self.authorize(write=True)
        asked, repos = json.loads(self.body), self.server.repos
        repo = f"{asked.get('organization') or self.server.user}/{asked['name']}"
        url = f"http://{self.headers['Host']}/{repo}"
        if repo in repos:  # create_repo(exist_ok=True) reads "url" here too
            return self.send(409, {"error": "You already created this model repo", "url": url})
        repos[repo] = {"private": asked.get("visibility") == "private", "refs": {}, "commits": {}}
        gitattributes = self.server.put(b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
        self.server.commit(repo, "main", {".gitattributes": gitattributes}, "initial commit")
        self.send(200, {"url": url})

    def settings(self, repo: str) -> None:
        self.repo(repo, write=True)["private"] = json.loads(self.body)["visibility"] == "private"
        self.server.save()
        self.send(200, {})

    def preupload(self, repo: str, rev: str) -> None:
        self.repo(repo, write=True)
        self.send(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                   "shouldIgnore": False} for f in json.loads(self.body)["files"]]})

    def commit(self, repo: str, rev: str) -> None:
        self.repo(repo, write=True)
        files, title = dict(self.commit_of(repo, rev)[1]), "Upload files"
        for line in map(json.loads, self.body.splitlines()):
            key, value = line["key"], line["value"]
            if key == "header":
                title = value["summary"]
            elif key == "file":
                files[value["path"]] = self.server.put(base64.b64decode(value["content"]))
            elif key == "deletedFile":
                files.pop(value["path"], None)
            else:
                raise Answer(400, f"unsupported commit operation {key!r}: uploads are inline", "")
        sha = self.server.commit(repo, rev, files, title)
        self.send(200, {"commitOid": sha, "pullRequestUrl": None,
                        "commitUrl": f"http://{self.headers['Host']}/{repo}/commit/{sha}"})

    def branch(self, repo: str, name: str) -> None:  # from main, as vitzoo makes them
        sha, refs = self.commit_of(repo, "main")[0], self.repo(repo, write=True)["refs"]
        if name in refs:
            raise Answer(409, f"Reference already exists: {name}", "")
        refs[name] = sha
        self.server.save()
        self.send(200, {})


ROUTES = [
    ("POST", r"/api/repos/create", Handler.create),
    ("POST", r"/api/validate-yaml", lambda self: self.send(200, {"errors": [], "warnings": []})),
    ("GET", rf"/api/models/{REPO}(/revision/(?P<rev>[^/]+))?", Handler.info),
    ("GET", rf"/api/models/{REPO}/tree/(?P<rev>[^/]+)/?(?P<path>.*)", Handler.tree),
    ("PUT", rf"/api/models/{REPO}/settings", Handler.settings),
    ("POST", rf"/api/models/{REPO}/preupload/(?P<rev>[^/]+)", Handler.preupload),
    ("POST", rf"/api/models/{REPO}/commit/(?P<rev>[^/]+)", Handler.commit),
    ("POST", rf"/api/models/{REPO}/branch/(?P<name>[^/]+)", Handler.branch),
    ("GET", rf"/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", Handler.resolve),
    ("GET", r"/blobs/(?P<sha256>[0-9a-f]{64})", Handler.download_blob),
]


class HubServer(ThreadingHTTPServer):
    """The server of the repos in `root` (ROOT/hub.json, ROOT/blobs), serving inside `with`.
    With a token, writes and private repos need it."""

    daemon_threads = True  # a keep-alive connection must not hold up shutdown

    def __init__(self, root, *, token: str | None = None, port: int = 0, user: str = "user"):
        super().__init__(("127.0.0.1", port), Handler)
        self.root, self.token, self.user, self.lock = Path(root), token, user, threading.RLock()
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        state = self.root / "hub.json"
        self.repos = json.loads(state.read_text()) if state.exists() else {}
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def save(self) -> None:
        (self.root / "hub.json.tmp").write_text(json.dumps(self.repos))
        (self.root / "hub.json.tmp").replace(self.root / "hub.json")

    def blob(self, sha256: str) -> bytes:
        return (self.root / "blobs" / sha256).read_bytes()

    def put(self, data: bytes) -> dict:
        sha256 = hashlib.sha256(data).hexdigest()
        (self.root / "blobs" / sha256).write_bytes(data)
        try:
            lfs = "\0" in data.decode()  # the Hub keeps binary files in LFS
        except UnicodeDecodeError:
            lfs = True
        return {"sha256": sha256, "oid": git_blob_sha1(data), "size": len(data), "lfs": lfs}

    def commit(self, repo: str, branch: str, files: dict, title: str) -> str:
        commits, refs = self.repos[repo]["commits"], self.repos[repo]["refs"]
        sha = hashlib.sha1(json.dumps([refs.get(branch), title, files, len(commits)]).encode())
        commits[sha.hexdigest()] = {"parent": refs.get(branch), "title": title, "files": files}
        refs[branch] = sha.hexdigest()
        self.save()
        return sha.hexdigest()

    def __enter__(self) -> HubServer:
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()
