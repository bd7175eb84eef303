"""Two Hub failures of issue 35 item 7, each said with its real cause: an empty repo (a push that failed
half-way) and a server that refused a feature (501 on the Xet upload endpoint)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import vitzoo
from vitzoo.errors import HubError
from vitzoo.hub.explain import explain


def test_an_empty_repo_is_said_to_be_empty_not_a_missing_file(hub_server):
    from huggingface_hub import HfApi
    from hub_testing import TOKEN

    HfApi(endpoint=hub_server.url, token=TOKEN).create_repo("alice/half-pushed")
    with pytest.raises(HubError, match=r"alice/half-pushed on .* holds no model files .* an empty repo.*push the model again"):
        vitzoo.from_pretrained("hf-hub:alice/half-pushed")


class Refused(Exception):
    """An HTTP error as huggingface_hub raises it: the server's response, 501 on the Xet upload endpoint."""
    response = SimpleNamespace(status_code=501, request=SimpleNamespace(
        method="GET", url="http://127.0.0.1:1/api/models/alice/m/xet-write-token/main"))


class ReadError(Exception):
    """A network error by name (explain knows them by name): the retry after the refusal broke off."""


def test_a_refused_feature_is_named_not_a_server_to_wait_for():
    try:
        try:
            raise Refused("501 Server Error: Not Implemented")
        except Refused:
            raise ReadError("connection reset by peer")  # noqa: B904 (the chain is what huggingface_hub leaves)
    except ReadError as exc:
        said = str(explain(exc, "alice/m", None, "http://127.0.0.1:1", offline=False, writing=True))
    assert "501 Not Implemented" in said and "xet-write-token" in said and "HF_HUB_DISABLE_XET=1" in said
    assert "try again when the server is back" not in said and "will not help" in said
