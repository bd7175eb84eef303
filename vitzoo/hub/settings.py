"""The Hub settings vitzoo reads, as they are when a call is made: the server (HF_ENDPOINT), offline
mode (HF_HUB_OFFLINE), whether a token is sent (HF_TOKEN or the stored login), and how long a call
waits for a silent server (VITZOO_HUB_TIMEOUT). huggingface_hub reads some of them once, at import;
vitzoo reads them at every call and passes them on.
"""

from __future__ import annotations

import math
import os

from vitzoo.errors import HubError

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


def constants():
    """huggingface_hub's `constants`: the settings as it read them at import (imported on first use)."""
    from huggingface_hub import constants

    return constants


def endpoint(given: str | None) -> str:
    """The server: `given` (a call's endpoint=), else HF_ENDPOINT as it is now, else huggingface_hub's default.

    Always passed explicitly to huggingface_hub, which otherwise uses the HF_ENDPOINT it read when
    it was imported."""
    from urllib.parse import urlsplit

    url = (given or os.environ.get("HF_ENDPOINT") or constants().ENDPOINT).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise HubError(f"the Hub server {url!r} (HF_ENDPOINT or endpoint=) is not an http(s) URL; "
                       "e.g. https://huggingface.co, or unset HF_ENDPOINT for the default")
    return url


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub read it at import, or as it is set now."""
    value = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return bool(constants().HF_HUB_OFFLINE) or value in {"1", "ON", "YES", "TRUE"}


def token_sent(token: str | bool | None) -> bool:
    """Whether huggingface_hub sends a token: `token`, else HF_TOKEN or the stored login."""
    from huggingface_hub import get_token

    return bool(token) if token is not None else get_token() is not None
