"""The Hugging Face Hub as transport: pull a model repo through the standard Hugging Face cache, push a
folder as one commit.

    model.push_to_hub("alice/vit-b16-cifar10")                 # vitzoo.checkpoints.publish, through here
    vitzoo.from_pretrained("hf-hub:alice/vit-b16-cifar10@v1")   # branch, tag or commit after the @

Everything goes through `huggingface_hub` (`HfApi` to write, `snapshot_download` to read), so the
usual settings apply (`vitzoo.hub.settings`): `HF_ENDPOINT` (the server), `HF_TOKEN` (or
`hf auth login`), `HF_HOME` / `HF_HUB_CACHE` (the cache), `HF_HUB_OFFLINE=1` (cached files only).
vitzoo keeps no cache of its own (`vitzoo.hub.cache` verifies and repairs the Hugging Face one: a cached
file that no longer hashes to what the cache names it by is never loaded). huggingface_hub's
errors become `HubError`s that name the cause and the fix (`vitzoo.hub.explain`).

No request to the Hub waits longer than `VITZOO_HUB_TIMEOUT` seconds (default 30) for a silent server,
nor for a slow one: each has that long to connect and move its first 64 KiB, and as long again for
each 64 KiB after (`vitzoo.hub.deadline`); huggingface_hub sends some requests with no timeout at all.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitzoo import refname
from vitzoo.errors import HubError
from vitzoo.hub import cache, deadline, settings
from vitzoo.hub.explain import explain
from vitzoo.version import __version__
from vitzoo.weights.layout import CONFIG_NAME, HUB_FILES, HUB_PREFIX, WEIGHT_FILES

log = logging.getLogger("vitzoo")

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def _bound_waits(request) -> None:
    """A request hook: every wait of the request (connect, read, write, pool) at most `settings.timeout()`
    seconds, huggingface_hub's own shorter timeouts kept; and the whole request's deadline starts
    (`vitzoo.hub.deadline`)."""
    limit = settings.timeout()
    given = request.extensions.get("timeout") or {}
    bounded = {k: limit if given.get(k) is None else min(given[k], limit) for k in ("connect", "read", "write", "pool")}
    request.extensions = {**request.extensions, "timeout": bounded}
    deadline.start(limit)


def _bounded_session() -> None:
    """Add `_bound_waits` to huggingface_hub's shared HTTP client, and keep its connections to the
    deadline (it makes a new client after errors, so this is checked before every call)."""
    from huggingface_hub import close_session
    from huggingface_hub.utils import get_session

    settings.timeout()  # a bad VITZOO_HUB_TIMEOUT is refused before anything is sent
    client = get_session()
    if getattr(client, "_vitzoo_deadline", None) is None:
        if any(getattr(getattr(t, "_pool", None), "connections", None) for t in (client._transport, *client._mounts.values())):
            close_session()  # connections opened before would not keep the deadline: a new client
            client = get_session()
        client._vitzoo_deadline = deadline.install(client)
    hooks = client.event_hooks
    if _bound_waits not in hooks["request"]:
        client.event_hooks = {**hooks, "request": [*hooks["request"], _bound_waits]}


def check_revision(revision: str | None) -> str | None:
    """`revision` when it is None or a name git (and so the Hub) accepts for a branch, tag or commit."""
    reason = None if revision is None else refname.problem(revision)
    if reason is not None:
        raise HubError(f"{revision!r} is not a revision: {reason}; give a branch, tag or commit as git names "
                       "them (e.g. main, v1.0, a commit sha)")
    return revision


def parse(uri: str, pushing: bool = False) -> tuple[str, str | None]:
    """`hf-hub:ORG/NAME[@REVISION]` (the prefix is optional) -> (repo_id, revision or None). `pushing`:
    the repo a push goes to, said as push takes it (ORG/NAME; a branch after the @ or as --revision)."""
    text = uri[len(HUB_PREFIX):] if uri.startswith(HUB_PREFIX) else uri
    repo_id, _, revision = text.partition("@")
    if not _REPO_ID.match(repo_id) or (_ and not revision):
        form = ("a Hub repo to push to; write ORG/NAME (e.g. alice/vit-b16-cifar10), or ORG/NAME@BRANCH" if pushing
                else "a Hub model reference; write hf-hub:ORG/NAME or hf-hub:ORG/NAME@REVISION")
        raise HubError(f"{uri!r} is not {form}")
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
    repo_id, parsed_revision = parse(source)
    revision = check_revision(revision) or parsed_revision
    endpoint = settings.endpoint(endpoint)  # HF_ENDPOINT as set now, not only as it was at import
    offline = local_files_only or settings.offline()
    _bounded_session()
    common: dict[str, Any] = dict(repo_type="model", token=token, cache_dir=cache_dir, endpoint=endpoint,
                                  local_files_only=offline, library_name="vitzoo", library_version=__version__)

    def fetch() -> Path:
        try:
            return _fetch(repo_id, revision, common)
        except HubError:
            raise
        except Exception as exc:
            cache.remove_partial_downloads(repo_id, cache_dir)
            raise explain(exc, repo_id, revision, endpoint, offline=offline, writing=False,
                          sent_token=settings.token_sent(token)) from exc

    with deadline.call(settings.timeout()):
        folder = _verified(fetch(), fetch, f"{repo_id}{'@' + revision if revision else ''}", offline, endpoint)
    if not any((folder / name).exists() for name in WEIGHT_FILES):
        # an empty repo (a push that failed half-way) leaves no snapshot folder at all
        present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        where = f"{repo_id}{'@' + revision if revision else ''}"
        raise HubError(
            f"{where} on {endpoint} has no weights ({' or '.join(WEIGHT_FILES)}); it has {present}"
            if present else
            f"{where} on {endpoint} holds no model files (no {CONFIG_NAME}, no {' or '.join(WEIGHT_FILES)}): an empty "
            f"repo, as a push that failed before its files were committed leaves it; push the model again "
            f"(vitzoo push DIR {repo_id}) or name a revision that holds one (@REVISION)"
        )
    return folder


def _fetch(repo_id: str, revision: str | None, common: dict[str, Any]) -> Path:
    """The snapshot of the files a model needs, from the cache or the Hub (snapshot_download)."""
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=[*HUB_FILES, WEIGHT_FILES[0]], **common))
    if not (folder / WEIGHT_FILES[0]).exists():
        # no safetensors in this repo: the same commit's pytorch_model.bin, if it has one
        folder = Path(snapshot_download(repo_id, revision=folder.name, allow_patterns=list(WEIGHT_FILES[1:]), **common))
    return folder


def _verified(folder: Path, fetch, where: str, offline: bool, endpoint: str) -> Path:
    """`folder`, once every file in it holds what its hash says (`cache.damaged_files`). A damaged file is
    never loaded: offline it is a HubError saying how to repair it; online it is removed from the cache
    and downloaded again (`fetch`), saying so."""
    damaged = cache.damaged_files(folder)
    if not damaged:
        return folder
    repo_id = where.partition("@")[0]
    said = cache.describe(folder, damaged, where)
    if offline:
        raise HubError(f"{said}. vitzoo does not load it; repair the cache online with `vitzoo pull {where}`, "
                       "which downloads it again")
    cache.evict(folder, damaged)
    try:
        folder = fetch()
    except HubError as exc:
        raise HubError(f"{said}. It was removed from the cache, and downloading it again failed: {exc}",
                       not_cached=exc.not_cached) from exc
    again = cache.damaged_files(folder)
    if again:
        cache.evict(folder, again)
        raise HubError(f"the Hub at {endpoint} sent {', '.join(again)} of {repo_id} with other bytes than their hash "
                       "says (a broken transfer or server); nothing was kept: try again later")
    log.warning("vitzoo: %s. It was removed from the cache and downloaded again.", said)
    return folder


def upload_folder(
    directory: str | os.PathLike,
    repo_id: str,
    files: Sequence[str],
    *,
    commit_message: str,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    endpoint: str | None = None,
    replaces: Sequence[str] = (),
) -> str:
    """Upload those of `files` that `directory` holds to the model repo `repo_id` (`ORG/NAME[@REVISION]`)
    as one commit, which also deletes those of `replaces` that the repo holds and `directory` does not (an
    earlier push's in another layout); create the repo (and the branch `revision`) when they do not exist.
    Returns the commit's URL."""
    from huggingface_hub import HfApi

    directory = Path(directory)
    repo_id, parsed_revision = parse(repo_id, pushing=True)
    revision = check_revision(revision) or parsed_revision
    endpoint = settings.endpoint(endpoint)
    if settings.offline():
        raise HubError(f"HF_HUB_OFFLINE=1 forbids talking to the Hub, and pushing {repo_id} to {endpoint} must: "
                       "unset HF_HUB_OFFLINE to push")
    _bounded_session()
    api = HfApi(endpoint=endpoint, token=token, library_name="vitzoo")
    with deadline.call(settings.timeout()):  # the waits of all its requests together
        try:
            api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
            if private:
                _make_private(api, repo_id, endpoint)
            if revision is not None and revision != "main":
                api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
            names = [name for name in files if (directory / name).exists()]
            stale = [name for name in replaces if not (directory / name).exists()]
            info = api.upload_folder(
                repo_id=repo_id, folder_path=directory, repo_type="model", revision=revision,
                commit_message=commit_message, allow_patterns=names, delete_patterns=stale or None,
            )
        except HubError:
            raise
        except Exception as exc:
            raise explain(exc, repo_id, revision, endpoint, offline=False, writing=True,
                          sent_token=settings.token_sent(token)) from exc
    return str(getattr(info, "commit_url", info))


def _make_private(api, repo_id: str, endpoint: str) -> None:
    """An existing repo that is public is made private (`private=` of create_repo applies to a new repo
    only), before anything is uploaded to it; a HubError when it is still public afterwards."""
    if api.repo_info(repo_id, repo_type="model").private:
        return
    api.update_repo_settings(repo_id, repo_type="model", private=True)
    if not api.repo_info(repo_id, repo_type="model").private:
        raise HubError(f"{repo_id} on {endpoint} is still public after asking the Hub to make it private; nothing "
                       "was uploaded: make it private in its settings on the Hub, or push without --private")
    log.warning("vitzoo: %s was public: made it private, as asked (--private / private=True)", repo_id)
