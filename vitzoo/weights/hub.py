"""The Hugging Face Hub: pull a model repo into the Hugging Face cache, push a folder as one commit.

huggingface_hub does the transport, its retries, the cache and the settings (HF_ENDPOINT, HF_TOKEN,
HF_HOME, HF_HUB_OFFLINE, HF_HUB_DOWNLOAD_TIMEOUT). What it does not do is added here:
- a cached file that no longer hashes to the name the cache gives its blob is never loaded;
- a server that never answers cannot hang a call: a request's answer must begin within
  HF_HUB_DOWNLOAD_TIMEOUT seconds of its body being sent, and every read keeps that timeout;
- its errors become `HubError`s naming the repo, the revision and the cause (`explain`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path

from vitzoo.errors import HubError
from vitzoo.io import write_text
from vitzoo.version import __version__
from vitzoo.weights.layout import CONFIG_NAME, HUB_FILES, HUB_PREFIX, WEIGHT_FILES

log = logging.getLogger("vitzoo")
STAMPS_NAME = "vitzoo-verified.json"  # blobs whose hash matched, by file state, beside snapshots/


def check_revision(revision: str | None) -> str | None:
    """`revision` if it is None or a name git accepts for a branch, tag or commit: it becomes a file
    name in the cache (`refs/REVISION`), where `..` would reach outside it."""
    name = revision or ""
    if revision is not None and (
            re.search(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|^/|[/.]$|^@$|^$", name)
            or any(part.startswith(".") or part.endswith(".lock") for part in name.split("/"))):
        raise HubError(f"{revision!r} is not a revision: give a branch, tag or commit as git names "
                       "them (e.g. main, v1.0, a commit sha; no '..', spaces or any of ~^:?*[\\)")
    return revision


def parse(uri: str, pushing: bool = False) -> tuple[str, str | None]:
    """`[hf-hub:]ORG/NAME[@REVISION]` -> (repo_id, revision or None)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    repo_id, at, revision = uri.removeprefix(HUB_PREFIX).partition("@")
    if not re.match(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$", repo_id) or (at and not revision):
        raise HubError(f"{uri!r} is not " + (
            "a Hub repo to push to; write ORG/NAME (e.g. alice/vit-b16-cifar10), or ORG/NAME@BRANCH"
            if pushing else
            "a Hub model reference; write hf-hub:ORG/NAME or hf-hub:ORG/NAME@REVISION"))
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubError(f"{repo_id!r} is not a valid Hub repo id ({exc}); write ORG/NAME") from None
    return repo_id, check_revision(revision or None)


def _settings(endpoint: str | None, token) -> tuple[str, bool, bool]:
    """The server (`endpoint`, else HF_ENDPOINT as it is now: huggingface_hub reads it at import),
    whether offline mode is on, and whether a token is sent."""
    from huggingface_hub import constants, get_token

    url = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    if not re.match(r"^https?://[^/]+", url):
        raise HubError(f"the Hub server {url!r} (HF_ENDPOINT or endpoint=) is not an http(s) URL; "
                       "e.g. https://huggingface.co, or unset HF_ENDPOINT for the default")
    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in {
        "1", "ON", "YES", "TRUE"}
    _bound_requests()
    return url, offline, bool(token) if token is not None else get_token() is not None


def _timeout() -> float:
    from huggingface_hub import constants

    return float(constants.HF_HUB_DOWNLOAD_TIMEOUT)


def _bounded_client():
    """huggingface_hub's HTTP client, each request kept to `_timeout()` (some have none)."""
    import httpx2
    from huggingface_hub.utils._http import default_client_factory

    class Bounded(httpx2.BaseTransport):
        def __init__(self, inner) -> None:
            self.inner = inner

        def handle_request(self, request):
            limit, given = _timeout(), request.extensions.get("timeout") or {}
            request.extensions["timeout"] = {k: min(given.get(k) or limit, limit)
                                             for k in ("connect", "read", "write", "pool")}
            body, sent, done, outcome = request.stream, threading.Event(), threading.Event(), {}

            class Sending(httpx2.SyncByteStream):
                def __iter__(self):
                    yield from body
                    sent.set()

            request.stream = Sending()

            def send() -> None:
                try:
                    outcome["response"] = self.inner.handle_request(request)
                except BaseException as exc:  # raised in the caller's thread
                    outcome["error"] = exc
                sent.set()
                done.set()

            threading.Thread(target=send, daemon=True).start()  # left to a silent server
            sent.wait()  # each write keeps the write timeout
            if not done.wait(limit):
                raise httpx2.ReadTimeout(f"no answer within {limit:g} s", request=request)
            if "error" in outcome:
                raise outcome["error"]
            return outcome["response"]

        def close(self) -> None:
            self.inner.close()

    client = default_client_factory()
    client._transport = Bounded(client._transport)
    client._mounts = {pattern: t and Bounded(t) for pattern, t in client._mounts.items()}
    return client


def _bound_requests() -> None:
    from huggingface_hub.utils import _http

    if _http._GLOBAL_CLIENT_FACTORY is not _bounded_client:
        _http.set_client_factory(_bounded_client)


def explain(exc: Exception, repo_id: str, revision: str | None, endpoint: str, *, writing: bool,
            offline: bool = False, token_sent: bool = True) -> HubError:
    """A HubError for a huggingface_hub or network error, naming what is at fault."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub import errors as e

    where = f"{repo_id}@{revision}" if revision else repo_id
    doing, cache = "uploading" if writing else "downloading", constants.HF_HUB_CACHE
    not_cached = "" if writing else f", and {where} is not in the Hugging Face cache ({cache})"
    chain = [exc]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) not in (None, *chain):
        chain.append(cause)
    network = next((c for c in chain if isinstance(c, (httpx2.TransportError, ConnectionError))),
                   None)

    def status(error: BaseException) -> int | None:
        return getattr(getattr(error, "response", None), "status_code", None)

    refused = next((c for c in chain if status(c) == 501), None)
    if isinstance(exc, e.GatedRepoError):
        return HubError(f"{repo_id} on {endpoint} is gated: accept its conditions on the Hub, then "
                        "set HF_TOKEN")
    if isinstance(exc, e.RevisionNotFoundError):
        return HubError(f"the model repository {repo_id} on {endpoint} has no revision "
                        f"{revision!r}; check the branch, tag or commit after the @ (the default "
                        "branch is main)")
    if isinstance(exc, e.RepositoryNotFoundError):
        return HubError(f"no model repository {repo_id} on {endpoint} (or it is private and the "
                        "token sent does not grant access): check the name; for a private repo set "
                        "HF_TOKEN or pass token=")
    if status(exc) in (401, 403):
        action, write = ("write to", " (a token with write access)") if writing else ("read", "")
        if not token_sent:
            return HubError(f"the Hub at {endpoint} needs a token to {action} {repo_id} and none "
                            f"was sent: set HF_TOKEN, run `hf auth login` or pass token={write}")
        said = "Unauthorized" if status(exc) == 401 else "Forbidden"
        return HubError(f"the Hub at {endpoint} refused the token ({status(exc)} {said}) trying to "
                        f"{action} {repo_id}: set a valid token with HF_TOKEN, `hf auth login` or "
                        f"token={write}")
    if offline or isinstance(exc, e.OfflineModeIsEnabled):
        return HubError(f"{where} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1 "
                        f"forbids downloading it: pull it once online (`vitzoo pull {where}`), "
                        "point HF_HOME at the cache that holds it, or unset HF_HUB_OFFLINE",
                        not_cached=True)
    if refused is not None:  # the server lacks a feature the client used: waiting will not bring it
        url = str(getattr(getattr(refused.response, "request", None), "url", ""))
        fix = "upload without Xet storage (HF_HUB_DISABLE_XET=1)" if "xet" in url.lower() else \
            "use a server that has it"
        return HubError(f"the Hub at {endpoint} does not implement a request {doing} {where} made "
                        f"({url}): 501 Not Implemented; trying again will not help: {fix}")
    if isinstance(network, httpx2.TimeoutException):
        offline_fix = "" if writing else (", or work offline: HF_HUB_OFFLINE=1 loads cached "
                                          "models, and a local directory loads without the Hub")
        return HubError(f"the Hub at {endpoint} did not answer within {_timeout():g} s while "
                        f"{doing} {where}{not_cached}: check the server and HF_ENDPOINT, wait "
                        f"longer with HF_HUB_DOWNLOAD_TIMEOUT=SECONDS{offline_fix}",
                        not_cached=not writing)
    connecting = (httpx2.ConnectError, ConnectionRefusedError)
    if network is not None and not isinstance(network, connecting):
        return HubError(f"the connection to the Hub at {endpoint} broke off while {doing} {where} "
                        f"({type(network).__name__}: {network}): try again; a download resumes "
                        "where it stopped")
    if network is not None or isinstance(exc, e.LocalEntryNotFoundError):
        detail = f"{type(network).__name__}: {network}" if network else str(exc).splitlines()[0]
        return HubError(f"cannot reach the Hub at {endpoint} ({detail}){not_cached}: check the "
                        "network and HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use cached models "
                        "only", not_cached=not writing)
    if isinstance(exc, e.HfHubHTTPError):
        return HubError(f"the Hub at {endpoint} answered {status(exc)} for {where}: "
                        f"{str(exc).splitlines()[0]}")
    return HubError(f"{doing} {where} via {endpoint} failed: {type(exc).__name__}: {exc}")


def _damaged(snapshot: Path) -> dict[str, str]:
    """The files of a snapshot whose blob no longer hashes to its name in the cache (an LFS file's
    sha256, another's git blob sha1), each with that hash's kind. A blob that matched is hashed
    again only when its size, times or inode change (STAMPS_NAME)."""
    from huggingface_hub.utils import sha

    stamps_path = snapshot.parent.parent / STAMPS_NAME
    try:
        stamps = json.loads(stamps_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stamps = {}
    damaged, before = {}, dict(stamps)
    for entry in sorted(p for p in snapshot.rglob("*") if p.is_file()):
        blob, st = entry.resolve(), entry.stat()
        state = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        if stamps.get(blob.name) == state or not re.fullmatch(r"[0-9a-f]{40}([0-9a-f]{24})?",
                                                              blob.name):
            continue
        with open(blob, "rb") as f:
            lfs = len(blob.name) == 64
            if (sha.sha_fileobj(f).hex() if lfs else sha.git_hash(f.read())) == blob.name:
                stamps[blob.name] = state
            else:
                stamps.pop(blob.name, None)
                name = entry.relative_to(snapshot).as_posix()
                damaged[name] = "sha256" if lfs else "git blob sha1"
    if stamps != before:
        try:
            write_text(stamps_path, json.dumps(stamps, sort_keys=True) + "\n")
        except OSError:
            pass  # a read-only cache: hashed again next time
    return damaged


def _remove(snapshot: Path, names) -> None:
    """These files of a snapshot out of the cache, blob and entry: downloaded again next time."""
    for name in names:
        (snapshot / name).resolve().unlink(missing_ok=True)
        (snapshot / name).unlink(missing_ok=True)


def download(source: str, *, revision: str | None = None, token: str | bool | None = None,
             cache_dir: str | os.PathLike | None = None, endpoint: str | None = None,
             local_files_only: bool = False) -> Path:
    """The snapshot folder, in the Hugging Face cache, of a model repo's config and weights (the
    first of WEIGHT_FILES it has). `source`: `[hf-hub:]ORG/NAME[@REVISION]`; `revision` wins."""
    from huggingface_hub import snapshot_download

    repo_id, parsed = parse(source)
    revision = check_revision(revision) or parsed
    endpoint, offline, token_sent = _settings(endpoint, token)
    offline, where = offline or local_files_only, f"{repo_id}{'@' + revision if revision else ''}"
    common = dict(token=token, cache_dir=cache_dir, endpoint=endpoint, local_files_only=offline,
                  library_name="vitzoo", library_version=__version__)

    def fetch() -> Path:
        try:
            folder = Path(snapshot_download(repo_id, revision=revision, **common,
                                            allow_patterns=[*HUB_FILES, WEIGHT_FILES[0]]))
            if not (folder / WEIGHT_FILES[0]).exists():  # the same commit's other weights file
                folder = Path(snapshot_download(repo_id, revision=folder.name, **common,
                                                allow_patterns=list(WEIGHT_FILES[1:])))
            return folder
        except Exception as exc:
            raise explain(exc, repo_id, revision, endpoint, writing=False, offline=offline,
                          token_sent=token_sent) from exc

    folder = fetch()
    damaged = _damaged(folder)
    if damaged:  # never loaded: refused offline, downloaded again online
        said = "; ".join(f"the cached {name} of {where} is damaged: its bytes no longer hash to "
                         f"the {kind} {(folder / name).resolve().name[:12]}... the Hugging Face "
                         "cache names its blob by" for name, kind in damaged.items())
        said += " (changed on disk after the download)"
        if offline:
            raise HubError(f"{said}. vitzoo does not load it; repair the cache online with "
                           f"`vitzoo pull {where}`")
        _remove(folder, damaged)
        try:
            folder = fetch()
        except HubError as exc:
            raise HubError(f"{said}. It was removed from the cache; downloading it again failed: "
                           f"{exc}", not_cached=exc.not_cached) from exc
        again = _damaged(folder)
        if again:
            _remove(folder, again)
            raise HubError(f"the Hub at {endpoint} sent {', '.join(again)} of {repo_id} with other "
                           "bytes than their hash says; nothing was kept: try again later")
        log.warning("vitzoo: %s. It was removed from the cache and downloaded again.", said)
    if not any((folder / name).exists() for name in WEIGHT_FILES):
        present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        raise HubError(
            f"{where} on {endpoint} has no weights ({' or '.join(WEIGHT_FILES)}); it has {present}"
            if present else f"{where} on {endpoint} holds no model files (no {CONFIG_NAME}, no "
            "weights): an empty repo, as a push that failed half-way leaves it; push the model "
            f"again (vitzoo push DIR {repo_id}) or name a revision that holds one (@REVISION)")
    return folder


def upload_folder(directory: str | os.PathLike, repo_id: str, files, *,
                  commit_message: str = "Upload vitzoo model", token: str | None = None,
                  private: bool = False, revision: str | None = None, endpoint: str | None = None,
                  replaces=()) -> str:
    """Upload those of `files` that `directory` holds to `repo_id` (`ORG/NAME[@BRANCH]`) as one
    commit, deleting those of `replaces` it does not hold; the repo and the branch are created when
    missing, and an existing public repo is made private when `private`. Returns the commit URL."""
    from huggingface_hub import HfApi

    directory = Path(directory)
    repo_id, parsed = parse(repo_id, pushing=True)
    revision = check_revision(revision) or parsed
    endpoint, offline, token_sent = _settings(endpoint, token)
    if offline:
        raise HubError(f"HF_HUB_OFFLINE=1 forbids talking to the Hub, and pushing {repo_id} to "
                       f"{endpoint} must: unset HF_HUB_OFFLINE to push")
    api = HfApi(endpoint=endpoint, token=token, library_name="vitzoo")
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if private and not api.repo_info(repo_id).private:  # private= of create_repo: new repos
            api.update_repo_settings(repo_id, private=True)
            if not api.repo_info(repo_id).private:
                raise HubError(f"{repo_id} on {endpoint} is still public after asking the Hub to "
                               "make it private; nothing was uploaded: make it private on the Hub, "
                               "or push without --private")
            log.warning("vitzoo: %s was public: made it private, as asked (--private)", repo_id)
        if revision not in (None, "main"):
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id, folder_path=directory, revision=revision,
            commit_message=commit_message,
            allow_patterns=[name for name in files if (directory / name).exists()],
            delete_patterns=[name for name in replaces if not (directory / name).exists()] or None)
    except HubError:
        raise
    except Exception as exc:
        raise explain(exc, repo_id, revision, endpoint, writing=True,
                      token_sent=token_sent) from exc
    return str(getattr(info, "commit_url", info))
