"""huggingface_hub's and the network's errors, said as `HubError`s that name the cause and the fix:
a wrong name, revision or token, a gated repo, offline mode without a cached copy, a server that
does not answer or breaks off.
"""

from __future__ import annotations

from vitzoo.errors import HubError
from vitzoo.hub import settings

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


def _not_implemented(exc: BaseException | None) -> BaseException | None:
    """The error in `exc`'s chain whose response was 501 Not Implemented, if there is one (a retried
    upload can end in a network error whose context is the server's refusal)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _status(exc) == 501:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def explain(exc: Exception, repo_id: str, revision: str | None, endpoint: str, *, offline: bool, writing: bool,
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
    cache = settings.constants().HF_HUB_CACHE
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
            f"(`vitzoo pull {where}`)"
        )
    if offline or isinstance(exc, OfflineModeIsEnabled):
        return HubError(
            f"{where} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1 forbids downloading it: "
            f"pull it once online (`vitzoo pull {where}`), point HF_HOME at the cache that holds it, "
            "or unset HF_HUB_OFFLINE",
            not_cached=True,
        )
    refused = _not_implemented(exc)
    if refused is not None:  # the server answered, and refused a feature: no waiting brings it back
        request = getattr(refused.response, "request", None)
        url = f" ({request.method} {request.url})" if request is not None else ""
        xet = "xet" in str(getattr(request, "url", "")).lower() or "xet" in str(refused).lower()
        return HubError(
            f"the Hub at {endpoint} does not implement a request that {'uploading' if writing else 'downloading'} "
            f"{where} made{url}: 501 Not Implemented. The server lacks a feature huggingface_hub used, so trying "
            "again will not help: "
            + ("upload without Xet storage (HF_HUB_DISABLE_XET=1, or uninstall hf_xet) or use a server that has it"
               if xet else "use a server (or a huggingface_hub version) that has it")
        )
    network = _connection_error(exc)
    if network is not None and any("Timeout" in c.__name__ for c in type(network).__mro__):
        return HubError(
            f"the Hub at {endpoint} did not answer within {settings.timeout():g} s ({type(network).__name__}"
            f"{': ' + str(network) if str(network) else ''}) while "
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
