"""The Hugging Face Hub: push saved models, pull them through the standard Hugging Face cache.

    model.push_to_hub("alice/vit-b16-cifar10")                 # config.json, model.safetensors, README.md
    vitzoo.from_pretrained("hf-hub:alice/vit-b16-cifar10@v1")   # branch, tag or commit after the @

Everything goes through `huggingface_hub` (`HfApi` to write, `snapshot_download` to read), so the
usual settings apply: `HF_ENDPOINT` (the server), `HF_TOKEN` (or `hf auth login`), `HF_HOME` /
`HF_HUB_CACHE` (the cache), `HF_HUB_OFFLINE=1` (cached files only). vitzoo keeps no cache of its own.
huggingface_hub's errors become `HubError`s that name the cause and the fix.

No Hub call waits for a silent server longer than `VITZOO_HUB_TIMEOUT` seconds (default 30) to
connect, or between two reads or writes: huggingface_hub sends some requests with no timeout at all.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from vitzoo.errors import HubError
from vitzoo.version import __version__
from vitzoo.weights.layout import CONFIG_NAME, HUB_FILES, HUB_PREFIX, SAVED_FILES, WEIGHT_FILES, WEIGHTS_NAME
from vitzoo.weights.native import read_config, save_pretrained

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


TIMEOUT_ENV = "VITZOO_HUB_TIMEOUT"
DEFAULT_TIMEOUT = 30.0




def timeout() -> float:
    """Seconds a Hub call waits to connect, and for each read or write: VITZOO_HUB_TIMEOUT or 30."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise HubError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds above 0; e.g. {TIMEOUT_ENV}=30")
    return value


def _bound_waits(request) -> None:
    """A request hook: every wait of the request (connect, read, write, pool) at most `timeout()`
    seconds; huggingface_hub's own shorter timeouts stay."""
    limit = timeout()
    given = request.extensions.get("timeout") or {}
    bounded = {k: limit if given.get(k) is None else min(given[k], limit) for k in ("connect", "read", "write", "pool")}
    request.extensions = {**request.extensions, "timeout": bounded}


def _bounded_session() -> None:
    """Add `_bound_waits` to huggingface_hub's shared HTTP client (it makes a new one after errors, so
    this is checked before every call)."""
    from huggingface_hub.utils import get_session

    timeout()  # a bad VITZOO_HUB_TIMEOUT is refused before anything is sent
    client = get_session()
    hooks = client.event_hooks
    if _bound_waits not in hooks["request"]:
        client.event_hooks = {**hooks, "request": [*hooks["request"], _bound_waits]}


def check_revision(revision: str | None) -> str | None:
    """`revision` when it is None or a name git (and so the Hub) accepts for a branch, tag or commit."""
    from vitzoo import refname

    reason = None if revision is None else refname.problem(revision)
    if reason is not None:
        raise HubError(f"{revision!r} is not a revision: {reason}; give a branch, tag or commit as git names "
                       "them (e.g. main, v1.0, a commit sha)")
    return revision


def parse(uri: str) -> tuple[str, str | None]:
    """`hf-hub:ORG/NAME[@REVISION]` (the prefix is optional) -> (repo_id, revision or None)."""
    text = uri[len(HUB_PREFIX):] if uri.startswith(HUB_PREFIX) else uri
    repo_id, _, revision = text.partition("@")
    if not _REPO_ID.match(repo_id) or (_ and not revision):
        raise HubError(f"{uri!r} is not a Hub model reference; write hf-hub:ORG/NAME or hf-hub:ORG/NAME@REVISION")
    _check_repo_id(repo_id)
    return repo_id, check_revision(revision or None)


def _check_repo_id(repo_id: str) -> None:
    """The Hub's own rules for a name (length, '--', '..', ...), as huggingface_hub checks them: the
    same HubError on pull and on push, before anything is sent."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise HubError(f"{repo_id!r} is not a valid Hub repo id ({exc}); write ORG/NAME") from None


def _constants():
    from huggingface_hub import constants

    return constants


def _endpoint(endpoint: str | None) -> str:
    """The server: `endpoint`, else HF_ENDPOINT as it is now, else huggingface_hub's default.

    Always passed explicitly to huggingface_hub, which otherwise uses the HF_ENDPOINT it read when
    it was imported."""
    from urllib.parse import urlsplit

    url = (endpoint or os.environ.get("HF_ENDPOINT") or _constants().ENDPOINT).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HubError(f"the Hub server {url!r} (HF_ENDPOINT or endpoint=) is not an http(s) URL; "
                       "e.g. https://huggingface.co, or unset HF_ENDPOINT for the default")
    return url


def _offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub read it at import, or as it is set now."""
    value = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return bool(_constants().HF_HUB_OFFLINE) or value in {"1", "ON", "YES", "TRUE"}


_NETWORK_ERRORS = {"TransportError", "NetworkError", "ConnectError", "ReadError", "TimeoutException",
                   "RemoteProtocolError", "ConnectionError"}


def _connection_error(exc: BaseException | None) -> BaseException | None:
    """The network error behind `exc`, if there is one (huggingface_hub wraps its HTTP library's)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(cls.__name__ in _NETWORK_ERRORS for cls in type(exc).__mro__):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _status(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _token_sent(token: str | bool | None) -> bool:
    """Whether huggingface_hub sends a token: `token`, else HF_TOKEN or the stored login."""
    from huggingface_hub import get_token

    return bool(token) if token is not None else get_token() is not None


def _explain(exc: Exception, repo_id: str, revision: str | None, endpoint: str, *, offline: bool, writing: bool,
             sent_token: bool = True) -> HubError:
    """A HubError for a huggingface_hub / network error."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}@{revision}" if revision else repo_id
    cache = _constants().HF_HUB_CACHE
    status = _status(exc)
    if isinstance(exc, HFValidationError):
        return HubError(f"{repo_id!r} is not a valid Hub repo id ({exc}); write ORG/NAME")
    if isinstance(exc, GatedRepoError):
        return HubError(f"{repo_id} on {endpoint} is gated: accept its conditions on the Hub, then set HF_TOKEN")
    if isinstance(exc, RevisionNotFoundError):
        return HubError(
            f"the model repository {repo_id} on {endpoint} has no revision {revision!r}; "
            "check the branch, tag or commit after the @ (the default branch is main)"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(
            f"no model repository {repo_id} on {endpoint} (or it is private and the token sent does not grant "
            "access): check the name; for a private repo set HF_TOKEN or pass token="
        )
    if status in (401, 403) and not sent_token:
        return HubError(
            f"the Hub at {endpoint} needs a token to {'write to' if writing else 'read'} {repo_id} and none was "
            "sent: set HF_TOKEN, run `hf auth login` or pass token="
            + (" (a token with write access)" if writing else "")
        )
    if status in (401, 403):
        action = "write to" if writing else "read"
        return HubError(
            f"the Hub at {endpoint} refused the token ({status} {'Unauthorized' if status == 401 else 'Forbidden'}) "
            f"trying to {action} {repo_id}: set a valid token with HF_TOKEN, `hf auth login` or token="
            + ("; writing needs a token with write access" if writing else "")
        )
    if isinstance(exc, IncompleteSnapshotError):
        return HubError(
            f"{where} is only partly in the Hugging Face cache ({cache}) and the Hub cannot be used now "
            f"({'HF_HUB_OFFLINE=1' if offline else 'unreachable'}): download it again online "
            f"(`vitzoo pull {repo_id}`)"
        )
    if offline or isinstance(exc, OfflineModeIsEnabled):
        return HubError(
            f"{where} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1 forbids downloading it: "
            f"pull it once online (`vitzoo pull {repo_id}`), point HF_HOME at the cache that holds it, "
            "or unset HF_HUB_OFFLINE",
            not_cached=True,
        )
    network = _connection_error(exc)
    if network is not None and any("Timeout" in c.__name__ for c in type(network).__mro__):
        return HubError(
            f"the Hub at {endpoint} did not answer within {timeout():g} s ({type(network).__name__}) while "
            f"{'uploading' if writing else 'downloading'} {where}"
            + ("" if writing else f", and {where} is not in the Hugging Face cache ({cache})")
            + ": check the server and HF_ENDPOINT, wait longer with VITZOO_HUB_TIMEOUT=SECONDS"
            + ("" if writing else ", or work offline: HF_HUB_OFFLINE=1 loads cached models, and a local "
               "directory written by save_pretrained loads without the Hub"),
            not_cached=not writing,
        )
    if network is not None and not any(c.__name__ in ("ConnectError", "ConnectionRefusedError", "ConnectTimeout")
                                       for c in type(network).__mro__):
        # connected, then the transfer broke off (server stopped, connection reset, short body)
        return HubError(
            f"the connection to the Hub at {endpoint} broke off while {'uploading' if writing else 'downloading'} "
            f"{where} ({type(network).__name__}: {network}); nothing partial was kept"
            + ("" if writing else " in the cache") + ": try again when the server is back"
        )
    if network is not None or isinstance(exc, LocalEntryNotFoundError):
        detail = f"{type(network).__name__}: {network}" if network is not None else str(exc).splitlines()[0]
        tail = "" if writing else f", and {where} is not in the Hugging Face cache ({cache})"
        return HubError(
            f"cannot reach the Hub at {endpoint} ({detail}){tail}: check the network and HF_ENDPOINT, "
            "or set HF_HUB_OFFLINE=1 to use cached models only",
            not_cached=not writing,
        )
    if isinstance(exc, HfHubHTTPError):
        return HubError(f"the Hub at {endpoint} answered {status} for {where}: {str(exc).splitlines()[0]}")
    return HubError(f"{'upload to' if writing else 'download of'} {where} via {endpoint} failed: {type(exc).__name__}: {exc}")


def _remove_partial_downloads(repo_id: str, cache_dir: str | os.PathLike | None) -> None:
    """Delete the `.incomplete` blobs a failed download left in this repo's cache folder, each under
    the lock huggingface_hub takes for it (a concurrent download of the same file keeps its own)."""
    from filelock import FileLock, Timeout
    from huggingface_hub.file_download import repo_folder_name

    cache = Path(cache_dir or _constants().HF_HUB_CACHE)
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


def download(
    source: str,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    endpoint: str | None = None,
    local_files_only: bool = False,
) -> Path:
    """Fetch a model repo's config and weights into the Hugging Face cache; return the snapshot folder.

    `source` is `hf-hub:ORG/NAME[@REVISION]` or `ORG/NAME`; a `revision` argument wins over the @.
    Only the files a model needs are fetched: config.json (and preprocessor_config.json, README.md)
    and the first of model.safetensors, pytorch_model.bin that the repo has.
    """
    from huggingface_hub import snapshot_download

    repo_id, parsed_revision = parse(source)
    revision = check_revision(revision) or parsed_revision
    endpoint = _endpoint(endpoint)  # HF_ENDPOINT as set now, not only as it was at import
    offline = local_files_only or _offline()
    _bounded_session()
    common: dict[str, Any] = dict(repo_type="model", token=token, cache_dir=cache_dir, endpoint=endpoint,
                                  local_files_only=offline, library_name="vitzoo", library_version=__version__)
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=[*HUB_FILES, WEIGHT_FILES[0]], **common))
        if not (folder / WEIGHT_FILES[0]).exists():
            # no safetensors in this repo: the same commit's pytorch_model.bin, if it has one
            folder = Path(snapshot_download(repo_id, revision=folder.name, allow_patterns=list(WEIGHT_FILES[1:]), **common))
    except HubError:
        raise
    except Exception as exc:
        _remove_partial_downloads(repo_id, cache_dir)
        raise _explain(exc, repo_id, revision, endpoint, offline=offline, writing=False,
                       sent_token=_token_sent(token)) from exc
    if not any((folder / name).exists() for name in WEIGHT_FILES):
        present = sorted(p.name for p in folder.iterdir())
        raise HubError(
            f"{repo_id}{'@' + revision if revision else ''} on {endpoint} has no weights "
            f"({' or '.join(WEIGHT_FILES)}); it has {present}"
        )
    return folder


def push_folder(
    directory: str | os.PathLike,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload vitzoo model",
    endpoint: str | None = None,
) -> str:
    """Upload a directory written by `save_pretrained` as one commit; create the repo (and the branch
    `revision`) when they do not exist. Returns the commit's URL."""
    from huggingface_hub import HfApi

    directory = Path(directory)
    read_config(directory / CONFIG_NAME)  # refuse to upload something that is not a saved vitzoo model
    if not (directory / WEIGHTS_NAME).exists():
        raise HubError(f"{directory} has no {WEIGHTS_NAME}; write it with model.save_pretrained(...)")
    repo_id, parsed_revision = parse(repo_id)
    revision = check_revision(revision) or parsed_revision
    endpoint = _endpoint(endpoint)
    if _offline():
        raise HubError(f"HF_HUB_OFFLINE=1 forbids talking to the Hub, and pushing {repo_id} to {endpoint} must: "
                       "unset HF_HUB_OFFLINE to push")
    _bounded_session()
    api = HfApi(endpoint=endpoint, token=token, library_name="vitzoo")
    try:
        api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        if revision is not None and revision != "main":
            api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
        names = [name for name in SAVED_FILES if (directory / name).exists()]
        info = api.upload_folder(
            repo_id=repo_id, folder_path=directory, repo_type="model", revision=revision,
            commit_message=commit_message, allow_patterns=names,
        )
    except Exception as exc:
        raise _explain(exc, repo_id, revision, endpoint, offline=False, writing=True, sent_token=_token_sent(token)) from exc
    return str(getattr(info, "commit_url", info))


def push_to_hub(
    model,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload vitzoo model",
    endpoint: str | None = None,
    card: dict[str, Any] | None = None,
) -> str:
    """`model.save_pretrained` into a temporary directory, then `push_folder` it."""
    with tempfile.TemporaryDirectory(prefix="vitzoo-push-") as tmp:
        save_pretrained(model, tmp, card={"repo_id": repo_id, **(card or {})})
        return push_folder(tmp, repo_id, token=token, private=private, revision=revision,
                           commit_message=commit_message, endpoint=endpoint)


__all__ = ["HUB_PREFIX", "HubError", "check_revision", "download", "parse", "push_folder", "push_to_hub", "timeout"]
