"""The Hugging Face Hub through huggingface_hub, its cache and its HF_* settings. Added: a cached
file that no longer matches its hash is never loaded, and no request waits without a bound."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
from pathlib import Path

from vitzoo.errors import HubError
from vitzoo.io import write_text
from vitzoo.weights.layout import HUB_FILES, HUB_PREFIX, WEIGHT_FILES

# what git refuses in a ref name: a revision becomes a file name in the cache (refs/REVISION)
NOT_A_REF = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]|\.\.|@\{|//|^/|[/.]$|^@?$|(^|/)\.|\.lock(/|$)")


def check_revision(revision: str | None) -> str | None:
    if revision is not None and NOT_A_REF.search(revision):
        raise HubError(f"{revision!r} is not a revision: name a branch, tag or commit as git does")
    return revision


def parse(uri: str) -> tuple[str, str | None]:
    """`[hf-hub:]ORG/NAME[@REVISION]` -> (repo_id, revision or None)."""
    repo_id, at, revision = uri.removeprefix(HUB_PREFIX).partition("@")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id) or (at and not revision):
        raise HubError(f"{uri!r} is not a Hub repo: write ORG/NAME or ORG/NAME@REVISION")
    return repo_id, check_revision(revision or None)


def _bounded(request) -> None:  # huggingface_hub sends some requests with no timeout at all
    from huggingface_hub import constants
    limit, given = constants.HF_HUB_DOWNLOAD_TIMEOUT, request.extensions["timeout"]
    request.extensions["timeout"] = {k: min(v or limit, limit) for k, v in given.items()}


def _call(uri: str, revision: str | None, endpoint: str | None, pushing=False):
    """(repo_id, revision, endpoint, offline), HF_ENDPOINT and HF_HUB_OFFLINE read as they are."""
    from huggingface_hub import constants, get_session

    # at each call: huggingface_hub replaces its session after a failed connection
    if _bounded not in (hooks := get_session().event_hooks["request"]):
        hooks.append(_bounded)
    repo_id, parsed = parse(uri)
    offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE") == "1"
    if pushing and offline:
        raise HubError(f"HF_HUB_OFFLINE=1 forbids pushing {repo_id}: unset it to push")
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")
    return repo_id, check_revision(revision) or parsed, endpoint, offline


def explain(exc, repo_id, revision, endpoint, *, writing, offline=False) -> HubError:
    """The HubError that a huggingface_hub or network error stands for."""
    import httpx2
    from huggingface_hub import errors

    where, doing = f"{repo_id}@{revision}" if revision else repo_id, "push" if writing else "pull"
    net = next((e for e in (exc, exc.__cause__, exc.__context__)
                if isinstance(e, (httpx2.TransportError, ConnectionError))), None)
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"{repo_id} on {endpoint} has no revision {revision!r}: check the name")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return HubError(f"no model repo {repo_id} on {endpoint}; if it is private, set HF_TOKEN")
    if getattr(getattr(exc, "response", None), "status_code", None) in (401, 403):
        return HubError(f"{endpoint} needs a valid token to {doing} {repo_id}: set HF_TOKEN")
    if offline or isinstance(exc, errors.OfflineModeIsEnabled):
        return HubError(f"{where} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids a "
                        f"download: run `vitzoo pull {where}` online first", not_cached=True)
    if net or isinstance(exc, errors.LocalEntryNotFoundError):
        return HubError(f"cannot reach the Hub at {endpoint} ({net or exc!r}): check HF_ENDPOINT "
                        "or wait longer (HF_HUB_DOWNLOAD_TIMEOUT)", not_cached=not writing)
    if isinstance(exc, json.JSONDecodeError):
        return HubError(f"{endpoint} answered with a page, not the Hub's JSON: check HF_ENDPOINT")
    return HubError(f"the {doing} of {where} on {endpoint} failed: {exc!r}")


def _damaged(snapshot: Path) -> list[str]:
    """The files of a snapshot whose bytes no longer hash to the name of their blob in the cache
    (an LFS file's sha256, another's git blob sha1), each hashed once per file state."""
    from huggingface_hub.utils import sha

    path, damaged = snapshot.parent.parent / "vitzoo-verified.json", []  # blobs that matched
    stamps = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    before = dict(stamps)
    for entry in sorted(snapshot.iterdir()):
        blob, st = entry.readlink().name if entry.is_symlink() else "", entry.stat()
        state = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        if stamps.get(blob) == state or len(blob) not in (40, 64):
            continue
        with open(entry, "rb") as f:
            digest = sha.sha_fileobj(f).hex() if len(blob) == 64 else sha.git_hash(f.read())
        if digest == blob:
            stamps[blob] = state
        else:
            damaged.append(entry.name)
    if stamps != before:
        with contextlib.suppress(OSError):  # a read-only cache: hashed again next time
            write_text(path, json.dumps(stamps) + "\n")
    return damaged


def download(source: str, *, revision: str | None = None, token: str | bool | None = None) -> Path:
    """The snapshot, in the Hugging Face cache, of a repo's config and weights; hashes checked."""
    from huggingface_hub import snapshot_download

    repo_id, revision, endpoint, offline = _call(source, revision, None)
    where = f"{repo_id}@{revision}" if revision else repo_id
    for again in (False, True):
        get = functools.partial(snapshot_download, repo_id, token=token, endpoint=endpoint,
                                local_files_only=offline, force_download=again)
        try:
            folder = Path(get(revision=revision, allow_patterns=[*HUB_FILES, WEIGHT_FILES[0]]))
            if not (folder / WEIGHT_FILES[0]).exists():  # the same commit's other weights file
                folder = Path(get(revision=folder.name, allow_patterns=list(WEIGHT_FILES[1:])))
        except Exception as exc:
            raise explain(exc, repo_id, revision, endpoint, writing=False, offline=offline) from exc
        if not folder.is_dir():  # snapshot_download found no file to fetch
            raise HubError(f"{where} holds no model files: push one, or name a revision that does")
        if not (damaged := _damaged(folder)):
            return folder
        said = f"the cached {', '.join(damaged)} of {where} no longer matches its hash"
        if offline or again:
            raise HubError(f"{said}: not loaded; run `vitzoo pull {where}` online to repair it")
        logging.getLogger("vitzoo").warning("vitzoo: %s: downloading it again", said)


def upload_folder(directory, repo_id: str, files, *, commit_message="Upload vitzoo model",
                  token=None, private=False, revision=None, endpoint=None, replaces=()) -> str:
    """Upload `files` from `directory` to `repo_id` as one commit (its repo and branch made if
    missing), deleting those of `replaces` it lacks; returns the commit's URL."""
    from huggingface_hub import HfApi

    repo_id, revision, endpoint, _ = _call(repo_id, revision, endpoint, pushing=True)
    api = HfApi(endpoint=endpoint, token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if private:  # create_repo's private= is for a new repo only
            api.update_repo_settings(repo_id, private=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        return api.upload_folder(  # a file both uploaded and in `replaces` stays
            repo_id=repo_id, folder_path=directory, revision=revision, allow_patterns=list(files),
            commit_message=commit_message, delete_patterns=list(replaces) or None).commit_url
    except Exception as exc:
        raise explain(exc, repo_id, revision, endpoint, writing=True) from exc
